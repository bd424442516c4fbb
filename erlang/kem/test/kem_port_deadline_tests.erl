%%% @doc One timer per port owner (kem_port_deadline), on a real port
%%% process and real timers: the timer is armed for the earliest deadline,
%%% only calls past theirs are handed to kem_timeout (a probe written to
%%% the port), each once, and the timer is re-armed for the next one.
-module(kem_port_deadline_tests).
-include_lib("eunit/include/eunit.hrl").

now_ms() -> erlang:monotonic_time(millisecond).

%% A real port process that answers nothing, as a port whose GPU thread
%% is busy would (the probes fit in its pipe).
owner(Pending) ->
    Port = open_port({spawn_executable, os:find_executable("sleep")}, [binary, {packet, 4}, {args, ["30"]}]),
    #{port => Port, next => 100, probes => #{}, pending => Pending, timer => none, name => test}.

close(#{port := Port}) ->
    {os_pid, OsPid} = erlang:port_info(Port, os_pid),
    catch port_close(Port),
    os:cmd("kill " ++ integer_to_list(OsPid)).

call(Deadline) -> {{self(), make_ref()}, Deadline, execute_kernel, none}.

%% The clock is read in whole ms: a deadline of now + Timeout could pass
%% up to 1 ms before Timeout has (a probe at `timeout => 1' before the GPU
%% thread is in the call: kem_args_tests' session quarantine, 1 run in 3).
a_deadline_never_comes_before_its_timeout_test() ->
    Before = erlang:monotonic_time(microsecond),
    Deadline = kem_port_deadline:of_timeout(1),
    ?assert(Deadline * 1000 >= Before + 1000),
    ?assertEqual(infinity, kem_port_deadline:of_timeout(infinity)).

the_timer_is_armed_for_the_earliest_deadline_test() ->
    T = now_ms(),
    S1 = kem_port_deadline:arm(T + 5000, owner(#{})),
    ?assertMatch(#{timer := {_, _}}, S1),
    S2 = kem_port_deadline:arm(T + 100, S1),
    #{timer := {At, Ref}} = S2,
    ?assertEqual(T + 100, At),
    %% A later deadline leaves it, infinity too.
    ?assertEqual(S2, kem_port_deadline:arm(T + 200, S2)),
    ?assertEqual(S2, kem_port_deadline:arm(infinity, S2)),
    %% It fires at the earliest deadline, not before; the replaced timer never.
    receive {timeout, Ref, call_deadline} -> ok after 1000 -> ?assert(false) end,
    ?assert(now_ms() >= T + 100),
    receive {timeout, _, call_deadline} = Stale -> ?assertEqual(none, Stale) after 300 -> ok end,
    close(S2).

only_passed_calls_are_probed_once_each_test() ->
    T = now_ms(),
    Pending = #{1 => call(T - 10), 2 => call(T + 60000), 3 => call(infinity), 4 => call(T - 5), 5 => call(T + 30000)},
    {noreply, S} = kem_port_deadline:passed(owner(Pending)),
    #{probes := Probes, pending := After, timer := {At, _}} = S,
    %% Calls 1 and 4, oldest first: probes 100 and 101.
    ?assertMatch(#{100 := {1, _}, 101 := {4, _}}, Probes),
    ?assertEqual(2, map_size(Probes)),
    ?assertEqual(infinity, element(2, maps:get(1, After))),
    ?assertEqual(infinity, element(2, maps:get(4, After))),
    ?assertEqual(T + 60000, element(2, maps:get(2, After))),
    %% Re-armed for the next deadline still ahead.
    ?assertEqual(T + 30000, At),
    %% Firing again hands nothing over twice.
    {noreply, S3} = kem_port_deadline:passed(S#{timer := none}),
    ?assertEqual(Probes, maps:get(probes, S3)),
    [erlang:cancel_timer(R) || {_, R} <- maps:values(Probes)],
    close(S).
