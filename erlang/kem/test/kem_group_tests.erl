%%% @doc Group frames (kem_group, docs/protocol.md "Group frames") against
%%% the real port: many callers on a few kernels and sizes get their own
%%% values, calls that must not be grouped go beside the groups, a refused
%%% call in a group answers each of its callers as it would alone and nobody
%%% else, timeouts inside a group, a port killed with a group in flight or
%%% with group calls still held.
%%%
%%% To be sure calls share one frame, the owner is suspended (sys:suspend/1)
%%% while the callers queue in its mailbox, then resumed: it reads them back
%%% to back and sends them as group frames and one calls frame.
-module(kem_group_tests).
-include_lib("eunit/include/eunit.hrl").

-define(DOUBLE, <<"double">>).
-define(TABLE, <<"double_table">>).

group_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 120, fun many_callers_on_a_few_kernels_and_sizes/0},
      {timeout, 60, fun groups_beside_calls_that_are_not_grouped/0},
      {timeout, 60, fun refused_calls_in_a_group_answer_as_alone/0},
      {timeout, 60, fun timeouts_inside_a_group/0},
      {timeout, 120, fun port_killed_with_a_group_in_flight/0},
      {timeout, 120, fun held_group_calls_go_to_the_replacement/0}]}.

start() -> kem_test_app:start([{port_env, [{"KEM_TEST_HOOKS", "1"}]}]).

stop(Apps) -> kem_test_app:stop(Apps).

now_ms() -> erlang:monotonic_time(millisecond).

%% {group frames, calls in them} the owner of kem_port_1 has sent.
groups() ->
    Snap = kem_metrics:snapshot(),
    {proplists:get_value({group_frames, kem_port_1}, Snap, 0), proplists:get_value({group_calls, kem_port_1}, Snap, 0)}.

%% Group frames the port itself has read.
port_groups() ->
    {ok, #{kem_port_1 := Stats}} = kem:stats(),
    maps:get(group_frames, Stats, 0).

since({F0, C0}) ->
    {F1, C1} = groups(),
    {F1 - F0, C1 - C0}.

kernel(Kernel, Input, Hint) -> kem_port:call(kem_port_1, execute_kernel, {Kernel, Input, Hint}, 30000).

%% A call and the answer it must get.
double_call(Kernel, Words, Hint) ->
    Input = crypto:strong_rand_bytes(4 * Words),
    {fun() -> kernel(Kernel, Input, Hint) end, {ok, kem_ref:double_ref(Input, 4 * Words * Hint)}}.

%% 64 callers, 30 calls each, on two kernels, three sizes and two hints:
%% every answer is the reference answer to its own fresh input.
many_callers_on_a_few_kernels_and_sizes() ->
    Before = groups(),
    Parent = self(),
    Pids = [spawn_link(fun() -> Parent ! {self(), caller(30, [])} end) || _ <- lists:seq(1, 64)],
    Results = [receive {P, R} -> R after 100000 -> timeout end || P <- Pids],
    ?assertEqual(lists:duplicate(64, ok), Results),
    {Frames, Calls} = since(Before),
    io:format(user, "~n64 callers x 30 calls on 8 keys: ~b group frames holding ~b calls~n", [Frames, Calls]).

caller(0, Wrong) ->
    case Wrong of [] -> ok; _ -> {wrong, Wrong} end;
caller(N, Wrong) ->
    {Kernel, Hint} = lists:nth(rand:uniform(4), [{?DOUBLE, 1}, {?DOUBLE, 2}, {?TABLE, 1}, {?DOUBLE, 1}]),
    {Call, Want} = double_call(Kernel, lists:nth(rand:uniform(3), [1, 16, 256]), Hint),
    case Call() of
        Want -> caller(N - 1, Wrong);
        Got -> caller(N - 1, [{Kernel, Hint, Got} | Wrong])
    end.

%% Callers that queue in the suspended owner's mailbox (then Last, queued
%% after them) go out together; their results in order.
in_one_go(Funs) ->
    in_one_go(Funs, []).

in_one_go(Funs, Last) ->
    Parent = self(),
    ok = sys:suspend(kem_port_1),
    Pids = [spawn_link(fun() -> Parent ! {self(), F()} end) || F <- Funs],
    wait_queued(kem_port_1, length(Funs), now_ms() + 5000),
    LastPids = [spawn_link(fun() -> Parent ! {self(), F()} end) || F <- Last],
    wait_queued(kem_port_1, length(Funs) + length(Last), now_ms() + 5000),
    ok = sys:resume(kem_port_1),
    [receive {P, R} -> R after 20000 -> no_reply end || P <- Pids ++ LastPids].

wait_queued(Owner, N, Deadline) ->
    {message_queue_len, Len} = process_info(whereis(Owner), message_queue_len),
    case Len >= N orelse now_ms() > Deadline of
        true -> ok;
        false -> timer:sleep(2), wait_queued(Owner, N, Deadline)
    end.

%% Four groups (two hints of one kernel and size, another kernel, 64 KiB
%% inputs) beside a call of another size, params calls, opts calls and a
%% bulk call; only the groups' calls go as groups, and everyone gets their
%% own value.
groups_beside_calls_that_are_not_grouped() ->
    Grouped = [double_call(?DOUBLE, 4, 1) || _ <- lists:seq(1, 5)] ++
              [double_call(?DOUBLE, 4, 2) || _ <- lists:seq(1, 3)] ++
              [double_call(?TABLE, 2, 1) || _ <- lists:seq(1, 4)] ++
              [double_call(?DOUBLE, 16384, 1) || _ <- lists:seq(1, 2)],
    Image = crypto:strong_rand_bytes(4 * 8 * 8),
    Params = <<8:32/little, 8:32/little, 1:32/little, 0:32>>,
    Opts = crypto:strong_rand_bytes(16),
    Plain = [double_call(?DOUBLE, 3, 1)] ++
            [{fun() -> kem_port:call(kem_port_1, execute_kernel_with_params, {<<"pixelize">>, Image, Params}, 30000) end,
              {ok, Image}} || _ <- [1, 2]] ++
            [{fun() -> kem_port:call(kem_port_1, execute, {?DOUBLE, Opts, #{output_size_hint => 1}}, 30000) end,
              {ok, kem_ref:double_ref(Opts, 16)}} || _ <- [1, 2]],
    {Bulk, BulkWant} = double_call(?DOUBLE, 32768, 1),
    Mixed = shuffle(Grouped ++ Plain),
    Before = groups(),
    PortBefore = port_groups(),
    Results = in_one_go([F || {F, _} <- Mixed], [Bulk]),
    ?assertEqual([W || {_, W} <- Mixed] ++ [BulkWant], Results),
    ?assertEqual({4, length(Grouped)}, since(Before)),
    ?assertEqual(4, port_groups() - PortBefore).

shuffle(List) -> [X || {_, X} <- lists:sort([{rand:uniform(), X} || X <- List])].

%% Each refused kind of call, grouped: every caller of it gets exactly
%% what the same call gets alone; the good calls of the same frames get
%% their values.
refused_calls_in_a_group_answer_as_alone() ->
    Refused = [{<<"no_such_kernel">>, <<1, 2, 3, 4, 5, 6, 7, 8>>, 1},
               {<<"not a kernel id!">>, <<1, 2, 3, 4>>, 1},
               {?DOUBLE, <<1, 2, 3, 4>>, 16#7FFFFFFF}],
    Alone = [kernel(K, I, H) || {K, I, H} <- Refused],
    [?assertMatch({error, {_, _}}, A) || A <- Alone],
    Good = [double_call(?DOUBLE, 2, 1) || _ <- lists:seq(1, 4)] ++ [double_call(?DOUBLE, 1, 1)],
    Calls = [{fun() -> kernel(K, I, H) end, A} || {{K, I, H}, A} <- lists:zip(Refused, Alone), _ <- [1, 2, 3]] ++ Good,
    Mixed = shuffle(Calls),
    Before = groups(),
    Results = in_one_go([F || {F, _} <- Mixed]),
    ?assertEqual([W || {_, W} <- Mixed], Results),
    ?assertEqual({4, 3 * 3 + 4}, since(Before)),
    ?assertEqual({ok, <<2, 6, 10, 14>>}, kernel(?DOUBLE, <<1, 3, 5, 7>>, 1)).

%% The GPU is busy: in one group, calls with a short timeout are answered
%% `timeout' (the port kept), those with a long one are served after it.
timeouts_inside_a_group() ->
    OsPid = kem_port:os_pid(kem_port_1),
    Self = self(),
    spawn_link(fun() -> Self ! {busy, kem_port:call(kem_port_1, test_hook, {sleep_gpu, 1500}, 10000)} end),
    timer:sleep(200),
    Short = fun() -> kem_port:call(kem_port_1, execute_kernel, {?DOUBLE, <<1, 3, 5, 7>>, 1}, 300) end,
    Long = fun() -> kem_port:call(kem_port_1, execute_kernel, {?DOUBLE, <<1, 3, 5, 7>>, 1}, 10000) end,
    Forever = fun() -> kem_port:call(kem_port_1, execute_kernel, {?DOUBLE, <<1, 3, 5, 7>>, 1}, infinity) end,
    Before = groups(),
    Results = in_one_go([Short, Long, Short, Forever, Short, Long]),
    ?assertEqual({1, 6}, since(Before)),
    [?assertMatch({error, {timeout, _}}, lists:nth(I, Results)) || I <- [1, 3, 5]],
    [?assertEqual({ok, <<2, 6, 10, 14>>}, lists:nth(I, Results)) || I <- [2, 4, 6]],
    ?assertEqual({busy, {ok, ok}}, receive {busy, _} = B -> B after 10000 -> none end),
    ?assertEqual(OsPid, kem_port:os_pid(kem_port_1)).

%% kill -9 while a group waits behind a busy GPU: every caller of it is
%% answered, with an error (never a wrong value, never silence).
port_killed_with_a_group_in_flight() ->
    OsPid = kem_port:os_pid(kem_port_1),
    Self = self(),
    spawn_link(fun() -> Self ! {busy, kem_port:call(kem_port_1, test_hook, {sleep_gpu, 5000}, 20000)} end),
    timer:sleep(200),
    Parent = self(),
    Before = groups(),
    ok = sys:suspend(kem_port_1),
    Pids = [spawn_link(fun() -> Parent ! {self(), kernel(?DOUBLE, <<1, 3, 5, 7>>, 1)} end) || _ <- lists:seq(1, 30)],
    wait_queued(kem_port_1, 30, now_ms() + 5000),
    ok = sys:resume(kem_port_1),
    wait_sent(kem_port_1, 31, now_ms() + 5000),
    ?assertEqual({1, 30}, since(Before)),
    Killed = now_ms(),
    os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    Results = [receive {P, R} -> R after 10000 -> no_reply end || P <- Pids],
    io:format(user, "~nkill with a group of 30 in flight: answered within ~b ms~n", [now_ms() - Killed]),
    ?assertEqual([], [R || R <- Results, element(1, R) =/= error]),
    %% By the death, not by a deadline.
    ?assertEqual([], [R || {error, {Reason, _}} = R <- Results, Reason =/= port_exited]),
    receive {busy, _} -> ok after 10000 -> ok end,
    ?assertEqual(ok, kem_test_app:wait_for_service(10000)),
    ?assertEqual({ok, <<2, 6, 10, 14>>}, kernel(?DOUBLE, <<1, 3, 5, 7>>, 1)).

%% Every call reached the port: pending, and none held.
wait_sent(Owner, N, Deadline) ->
    #{pending := Pending, out := Held} = sys:get_state(Owner),
    case (maps:size(Pending) >= N andalso Held =:= []) orelse now_ms() > Deadline of
        true -> ok;
        false -> timer:sleep(2), wait_sent(Owner, N, Deadline)
    end.

%% The port dies while the owner still holds group candidates (their
%% frame not yet written): they never reached it, so they are sent again
%% to the replacement, and every caller gets its own value.
held_group_calls_go_to_the_replacement() ->
    ?assertEqual(ok, kem_test_app:wait_for_service(10000)),
    OsPid = kem_port:os_pid(kem_port_1),
    Calls = [double_call(?DOUBLE, 1, 1) || _ <- lists:seq(1, 20)],
    Parent = self(),
    ok = sys:suspend(kem_port_1),
    Pids = [spawn_link(fun() -> Parent ! {self(), F()} end) || {F, _} <- Calls],
    wait_queued(kem_port_1, 20, now_ms() + 5000),
    os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    %% The port's end of file is queued behind the 20 calls: the owner
    %% holds them all (its mailbox is never empty before it) and stops.
    wait_queued(kem_port_1, 21, now_ms() + 5000),
    ok = sys:resume(kem_port_1),
    Results = [receive {P, R} -> R after 30000 -> no_reply end || P <- Pids],
    ?assertEqual([W || {_, W} <- Calls], Results),
    ?assertNotEqual(OsPid, kem_port:os_pid(kem_port_1)).
