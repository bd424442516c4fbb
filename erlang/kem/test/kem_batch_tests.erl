%%% @doc Calls frames and replies frames (kem_port.erl, docs/protocol.md
%%% "Batch frames") against the real port: many callers' values and order,
%%% a bad call answering only its caller, a port killed with a calls frame
%%% in flight, timeouts inside one, and a lone caller never batched.
%%%
%%% To be sure several calls share one frame, the owner is suspended
%%% (sys:suspend/1) while the callers queue in its mailbox, then resumed:
%%% it reads them back to back and sends them as one calls frame, or as one
%%% group frame where they share kernel, hint and input size (kem_group;
%%% kem_group_tests has the groups' own tests). A "frame" here is either.
-module(kem_batch_tests).
-include_lib("eunit/include/eunit.hrl").

-define(DOUBLE, <<"double">>).

batch_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 120, fun many_callers_get_their_own_values_in_order/0},
      {timeout, 60, fun a_lone_caller_is_not_batched/0},
      {timeout, 60, fun bad_calls_in_a_calls_frame_answer_only_their_callers/0},
      {timeout, 60, fun timeouts_inside_a_calls_frame/0},
      {timeout, 120, fun port_killed_with_a_calls_frame_in_flight/0}]}.

start() -> kem_test_app:start([{port_env, [{"KEM_TEST_HOOKS", "1"}]}]).

stop(Apps) -> kem_test_app:stop(Apps).

now_ms() -> erlang:monotonic_time(millisecond).

%% Frames of many calls the port has read: calls frames and group frames.
calls_frames() ->
    {ok, #{kem_port_1 := Stats}} = kem:stats(),
    maps:get(calls_frames, Stats, 0) + maps:get(group_frames, Stats, 0).

double(Input) -> kem_port:call(kem_port_1, execute_kernel, {?DOUBLE, Input, 1}, 30000).

%% 64 callers, 25 calls each of fresh random sizes: each caller gets the
%% reference answer to each of its own calls, in its own order.
many_callers_get_their_own_values_in_order() ->
    Before = calls_frames(),
    Parent = self(),
    Pids = [spawn_link(fun() -> Parent ! {self(), caller(25, [])} end) || _ <- lists:seq(1, 64)],
    Results = [receive {P, R} -> R after 100000 -> timeout end || P <- Pids],
    ?assertEqual(lists:duplicate(64, ok), Results),
    Frames = calls_frames() - Before,
    io:format(user, "~n64 callers x 25 calls: ~b calls frames~n", [Frames]),
    ?assert(Frames > 0).

caller(0, Answers) ->
    %% Each answer is checked against its own input, in the caller's order.
    case [x || {Input, {ok, Out}} <- lists:reverse(Answers), Out =/= kem_ref:double_ref(Input, byte_size(Input))] of
        [] when length(Answers) =:= 25 -> ok;
        Wrong -> {wrong, length(Wrong), [R || {_, R} <- Answers, element(1, R) =/= ok]}
    end;
caller(N, Answers) ->
    Input = crypto:strong_rand_bytes(4 * rand:uniform(500)),
    caller(N - 1, [{Input, double(Input)} | Answers]).

a_lone_caller_is_not_batched() ->
    Before = calls_frames(),
    [?assertEqual({ok, <<2, 6, 10, 14>>}, double(<<1, 3, 5, 7>>)) || _ <- lists:seq(1, 20)],
    ?assertEqual(Before, calls_frames()).

%% Callers that queue in the suspended owner's mailbox go out as one frame.
in_one_frame(Funs) ->
    Parent = self(),
    Before = calls_frames(),
    ok = sys:suspend(kem_port_1),
    Pids = [spawn_link(fun() -> Parent ! {self(), F()} end) || F <- Funs],
    wait_queued(kem_port_1, length(Funs), now_ms() + 5000),
    ok = sys:resume(kem_port_1),
    Results = [receive {P, R} -> R after 20000 -> no_reply end || P <- Pids],
    {Results, calls_frames() - Before}.

wait_queued(Owner, N, Deadline) ->
    {message_queue_len, Len} = process_info(whereis(Owner), message_queue_len),
    case Len >= N orelse now_ms() > Deadline of
        true -> ok;
        false -> timer:sleep(2), wait_queued(Owner, N, Deadline)
    end.

bad_calls_in_a_calls_frame_answer_only_their_callers() ->
    %% Six sizes, all different: no two good calls form a group.
    Sizes = lists:sublist([S || {_, S} <- lists:sort([{rand:uniform(), S} || S <- lists:seq(1, 300)])], 6),
    Inputs = [crypto:strong_rand_bytes(4 * S) || S <- Sizes],
    Good = [fun() -> double(I) end || I <- Inputs],
    Bad = [fun() -> kem_port:call(kem_port_1, execute_kernel, {<<"no_such_kernel">>, <<1, 2, 3, 4>>, 1}, 30000) end,
           %% An integer wider than 8 bytes: refused by the port's frame
           %% check (etf_guard), inside the calls frame, to its caller only.
           fun() -> kem_port:call(kem_port_1, execute_kernel, {?DOUBLE, <<1, 2, 3, 4>>, 1 bsl 70}, 30000) end,
           fun() -> kem_port:call(kem_port_1, execute_kernel, {?DOUBLE, <<1, 2, 3, 4>>, 0}, 30000) end,
           fun() -> kem_port:call(kem_port_1, no_such_method, {}, 30000) end],
    {[G1, G2, G3, B1, B2, B3, B4, G4, G5, G6], Frames} =
        in_one_frame(lists:sublist(Good, 3) ++ Bad ++ lists:nthtail(3, Good)),
    ?assertEqual(1, Frames),
    ?assertEqual([{ok, kem_ref:double_ref(I, byte_size(I))} || I <- Inputs], [G1, G2, G3, G4, G5, G6]),
    ?assertMatch({error, {kernel_not_found, _}}, B1),
    ?assertMatch({error, {too_large, _}}, B2),
    ?assertMatch({error, {bad_args, _}}, B3),
    ?assertMatch({error, {unknown_method, _}}, B4),
    ?assertEqual({ok, <<2, 6, 10, 14>>}, double(<<1, 3, 5, 7>>)).

%% The GPU is busy: calls of one frame with a short timeout are answered
%% `timeout' (the port kept), those with a long one are served after it.
timeouts_inside_a_calls_frame() ->
    OsPid = kem_port:os_pid(kem_port_1),
    Self = self(),
    spawn_link(fun() -> Self ! {busy, kem_port:call(kem_port_1, test_hook, {sleep_gpu, 1500}, 10000)} end),
    timer:sleep(200),
    Short = fun() -> kem_port:call(kem_port_1, execute_kernel, {?DOUBLE, <<1, 3, 5, 7>>, 1}, 300) end,
    Long = fun() -> kem_port:call(kem_port_1, execute_kernel, {?DOUBLE, <<1, 3, 5, 7>>, 1}, 10000) end,
    {Results, Frames} = in_one_frame([Short, Long, Short, Long, Short, Long]),
    ?assertEqual(1, Frames),
    [?assertMatch({error, {timeout, _}}, R) || R <- [lists:nth(I, Results) || I <- [1, 3, 5]]],
    [?assertEqual({ok, <<2, 6, 10, 14>>}, R) || R <- [lists:nth(I, Results) || I <- [2, 4, 6]]],
    ?assertEqual({busy, {ok, ok}}, receive {busy, _} = B -> B after 10000 -> none end),
    ?assertEqual(OsPid, kem_port:os_pid(kem_port_1)).

%% kill -9 while a calls frame waits behind a busy GPU: every caller of it
%% is answered at once, with an error (never a wrong value, never silence).
port_killed_with_a_calls_frame_in_flight() ->
    OsPid = kem_port:os_pid(kem_port_1),
    Self = self(),
    spawn_link(fun() -> Self ! {busy, kem_port:call(kem_port_1, test_hook, {sleep_gpu, 5000}, 20000)} end),
    timer:sleep(200),
    Parent = self(),
    ok = sys:suspend(kem_port_1),
    Pids = [spawn_link(fun() -> Parent ! {self(), double(<<1, 3, 5, 7>>)} end) || _ <- lists:seq(1, 30)],
    wait_queued(kem_port_1, 30, now_ms() + 5000),
    ok = sys:resume(kem_port_1),
    wait_sent(kem_port_1, 31, now_ms() + 5000),
    Killed = now_ms(),
    os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    Results = [receive {P, R} -> R after 10000 -> no_reply end || P <- Pids],
    Last = now_ms() - Killed,
    io:format(user, "~nkill with a calls frame of 30 in flight: answered within ~b ms~n", [Last]),
    ?assertEqual([], [R || R <- Results, element(1, R) =/= error]),
    %% Each error is the death itself (`port_exited'), which no deadline
    %% gives: the owner failed every waiting caller when the port went. The
    %% bound is liveness only, as in kem_tests' kill test (1.1 s once there
    %% under load, against a 1 s bound).
    ?assertEqual([], [R || {error, {Reason, _}} = R <- Results, Reason =/= port_exited]),
    ?assert(Last < 5000),
    receive {busy, _} -> ok after 10000 -> ok end,
    ?assertEqual(ok, kem_test_app:wait_for_service(10000)),
    ?assertEqual({ok, <<2, 6, 10, 14>>}, double(<<1, 3, 5, 7>>)).

%% Every call reached the port: pending, and none held for a calls frame.
wait_sent(Owner, N, Deadline) ->
    #{pending := Pending, out := Held} = sys:get_state(Owner),
    case (maps:size(Pending) >= N andalso Held =:= []) orelse now_ms() > Deadline of
        true -> ok;
        false -> timer:sleep(2), wait_sent(Owner, N, Deadline)
    end.
