%%% @doc Warm spares with two port groups (`adapters => [0, 0]': two groups
%%% on the one adapter of a machine like this one, kem_place): each group
%%% keeps its own spares, a restart takes only its own group's, and calls
%%% that arrive while a group has no port ready queue until one is, in
%%% every group. Real ports, real processes; times are printed figures.
-module(kem_spare_groups_tests).
-include_lib("eunit/include/eunit.hrl").

-define(SMALL, <<1, 3, 5, 7>>).

groups_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 180, fun each_group_keeps_and_takes_its_own_spares/0},
      {timeout, 240, fun calls_queue_while_no_port_is_ready_in_every_group/0}]}.

start() ->
    kem_test_app:start([{adapters, [0, 0]}, {ports, 1}, {spares, 1}]).

stop(Apps) ->
    kem_test_app:stop(Apps).

%%% the tests

%% Two groups, one spare each, memory listed; killing group 2's port hands
%% it group 2's spare and leaves group 1's alone, and the other way round.
each_group_keeps_and_takes_its_own_spares() ->
    [Spare1, Spare2] = [ready_spare(G, now_ms() + 120000) || G <- [1, 2]],
    Info = kem_spare:info(),
    ?assertEqual([1, 2], lists:sort([G || #{group := G} <- Info])),
    ?assert(lists:all(fun(#{rss_kib := Kib}) -> is_integer(Kib) andalso Kib > 0 end, Info)),
    io:format(user, "~ntwo groups: spares ~0p~n",
              [[{G, P, Kib} || #{group := G, os_pid := P, rss_kib := Kib} <- Info]]),
    ok = kill_and_wait_back(kem_port_2),
    ?assertEqual(Spare2, kem_port:os_pid(kem_port_2)),
    ?assert(lists:member(Spare1, [P || #{group := 1, os_pid := P} <- kem_spare:info()])),
    _ = ready_spare(2, now_ms() + 120000),  % group 2 makes itself a new one
    ok = kill_and_wait_back(kem_port_1),
    ?assertEqual(Spare1, kem_port:os_pid(kem_port_1)),
    ?assertEqual([1, 2], lists:usort([G || #{group := G} <- kem_spare:info()])).

%% In each group: kill its port twice in a row, so the second restart finds
%% its group's next spare still starting; calls sent once the old owner is
%% gone wait (in the new owner's mailbox, or for the name) and are all
%% answered with the right bytes; a caller with a short deadline gets a
%% clear answer, never a hang.
calls_queue_while_no_port_is_ready_in_every_group() ->
    [queue_in_group(G, Name) || {G, Name} <- [{1, kem_port_1}, {2, kem_port_2}]],
    ok.

queue_in_group(G, Name) ->
    _ = ready_spare(G, now_ms() + 120000),
    ok = kill_and_wait_back(Name),
    ?assertEqual([], [P || #{group := G1, os_pid := P, stage := ready} <- kem_spare:info(), G1 =:= G]),
    Owner = whereis(Name),
    Ref = monitor(process, Owner),
    kill(kem_port:os_pid(Name)),
    Killed = now_ms(),
    receive {'DOWN', Ref, process, Owner, _} -> ok after 10000 -> error(owner_did_not_stop) end,
    Parent = self(),
    Sizes = [4, 1000, 4096, 65536],
    Callers = [spawn_link(fun() ->
                   Input = crypto:strong_rand_bytes(lists:nth(1 + I rem length(Sizes), Sizes)),
                   Result = kem_port:call(Name, execute_kernel, {<<"double">>, Input, 1}, 60000),
                   Parent ! {self(), now_ms(), Result =:= {ok, kem_ref:double_ref(Input, byte_size(Input))}}
               end) || I <- lists:seq(1, 20)],
    Short = kem_port:call(Name, execute_kernel, {<<"double">>, ?SMALL, 1}, 50),
    Answers = [receive {C, T, Right} -> {T, Right} after 120000 -> {never, false} end || C <- Callers],
    Last = lists:max([T || {T, _} <- Answers, is_integer(T)]),
    io:format(user, "~ngroup ~b with no port ready: 20 calls queued, all answered within ~b ms of the kill "
                    "(a spare was starting); a 50 ms call got ~0P~n", [G, Last - Killed, Short, 6]),
    ?assertEqual(lists:duplicate(20, true), [R || {_, R} <- Answers]),
    ?assert(case Short of
                {ok, <<2, 6, 10, 14>>} -> true;
                {error, {Reason, Detail}} -> is_atom(Reason) andalso is_binary(Detail);
                _ -> false
            end).

%%% helpers

now_ms() -> erlang:monotonic_time(millisecond).

kill(OsPid) ->
    os:cmd("kill -9 " ++ integer_to_list(OsPid)).

%% Kill a port's process and wait until the port answers again.
kill_and_wait_back(Name) ->
    OsPid = kem_port:os_pid(Name),
    kill(OsPid),
    first_success(Name, now_ms() + 60000),
    ?assertNotEqual(OsPid, kem_port:os_pid(Name)),
    ok.

first_success(Name, Deadline) ->
    case kem_port:call(Name, execute_kernel, {<<"double">>, ?SMALL, 1}, 30000) of
        {ok, <<2, 6, 10, 14>>} -> ok;
        _ ->
            ?assert(now_ms() < Deadline),
            timer:sleep(5),
            first_success(Name, Deadline)
    end.

%% The OS pid of a ready spare of group G.
ready_spare(G, Deadline) ->
    case [P || #{group := G1, os_pid := P, stage := ready} <- kem_spare:info(), G1 =:= G] of
        [Pid | _] -> Pid;
        [] ->
            ?assert(now_ms() < Deadline),
            timer:sleep(20),
            ready_spare(G, Deadline)
    end.
