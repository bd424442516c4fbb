%%% @doc eunit tests of the kem application against the real Python port on
%%% whatever adapter wgpu finds (Mesa's lavapipe on CI).
-module(kem_tests).
-include_lib("eunit/include/eunit.hrl").

-define(DOUBLE, <<"double">>).

kem_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 60, fun hello_and_adapter_info/0},
      {timeout, 60, fun worked_example/0},
      {timeout, 120, fun double_random_inputs/0},
      {timeout, 60, fun pixelize_uniform_image_is_unchanged/0},
      {timeout, 60, fun compat_errors_raise/0},
      {timeout, 60, fun modern_api_returns_errors/0},
      {timeout, 60, fun dev_kem_good_requests/0},
      {timeout, 60, fun dev_kem_bad_requests/0},
      {timeout, 60, fun dev_kem_info/0},
      {timeout, 60, fun lua_example_body_is_accepted/0},
      {timeout, 300, fun fifty_callers_twenty_calls_each/0},
      {timeout, 120, fun kill_port_with_calls_in_flight/0},
      {timeout, 120, fun call_outliving_its_timeout/0},
      {timeout, 60, fun stats_count_calls/0},
      {timeout, 120, fun large_payloads_go_through_shared_memory/0},
      {timeout, 120, fun shared_memory_files_removed_when_port_killed/0},
      {timeout, 60, fun stale_shared_memory_dirs_are_swept/0}]}.

start() -> kem_test_app:start([{port_env, [{"KEM_TEST_HOOKS", "1"}]}]).

stop(Apps) -> kem_test_app:stop(Apps).

%%% reference

double_ref(Input, OutputSize) -> kem_ref:double_ref(Input, OutputSize).

random_bytes(N) -> crypto:strong_rand_bytes(N).

%%% kem_nif

hello_and_adapter_info() ->
    ?assertEqual(<<"Hello world!">>, kem_nif:hello()),
    {ok, Info} = kem_json:decode(kem_nif:adapter_info()),
    [?assert(maps:is_key(K, Info)) || K <- [<<"name">>, <<"vendor">>, <<"device">>,
                                          <<"driver">>, <<"backend">>, <<"driver_info">>]].

worked_example() ->
    ?assertEqual(<<2, 6, 10, 14>>, kem_nif:execute_kernel(?DOUBLE, <<1, 3, 5, 7>>, 1)).

double_random_inputs() ->
    [begin
         Input = random_bytes(Size),
         ?assertEqual(double_ref(Input, Size * Hint), kem_nif:execute_kernel(?DOUBLE, Input, Hint))
     end || Size <- [1, 3, 4, 5, 255, 4097, 100003], Hint <- [1, 2, 3, 4]].

pixelize_uniform_image_is_unchanged() ->
    {W, H} = {50, 30},
    Image = binary:copy(<<10, 200, 30, 255>>, W * H),
    Params = <<W:32/little, H:32/little, 8:32/little, 0:32>>,
    ?assertEqual(Image, kem_nif:execute_kernel_with_params(<<"pixelize">>, Image, Params)).

compat_errors_raise() ->
    ?assertError({kernel_not_found, _}, kem_nif:execute_kernel(<<"no_such">>, <<1>>, 1)),
    ?assertError({invalid_kernel_id, _}, kem_nif:execute_kernel(<<"../x">>, <<1>>, 1)),
    ?assertError({bad_args, _}, kem_nif:execute_kernel_with_params(?DOUBLE, <<1>>, <<1, 0, 0, 0>>)),
    %% The original guards: a hint must be a positive integer.
    ?assertError(function_clause, kem_nif:execute_kernel(?DOUBLE, <<1>>, 0)),
    ?assertError(function_clause, kem_nif:execute_kernel(?DOUBLE, [1], 1)),
    ?assertEqual(<<2, 6, 10, 14>>, kem_nif:execute_kernel(?DOUBLE, <<1, 3, 5, 7>>, 1)).

modern_api_returns_errors() ->
    ?assertEqual({ok, <<2, 6, 10, 14, 0, 0, 0, 0>>},
                 kem:execute(?DOUBLE, <<1, 3, 5, 7>>, #{output_size_hint => 2})),
    ?assertEqual({ok, <<2, 6>>}, kem:execute(?DOUBLE, <<1, 3, 5, 7>>, #{output_size => 2})),
    ?assertMatch({error, {bad_args, _}}, kem:execute(?DOUBLE, <<1>>, #{nonsense => 1})),
    ?assertMatch({error, {bad_args, _}}, kem:execute(?DOUBLE, not_a_binary, #{})),
    ?assertMatch({error, {too_large, _}}, kem:execute(?DOUBLE, <<1>>, #{output_size => 1 bsl 40})),
    ?assertMatch({ok, pong}, kem:ping()).

%%% dev_kem

body(Map) -> kem_json:encode(Map).

%% A success without its usage keys (dev_kem_usage checks those).
reply({ok, Msg}) -> {ok, maps:filter(fun(K, _) -> binary:part(K, 0, min(10, byte_size(K))) =/= <<"kem-usage-">> end, Msg)};
reply(Other) -> Other.

dev_kem_good_requests() ->
    Body = body(#{<<"kernel_id">> => ?DOUBLE, <<"input_data">> => [1, 3, 5, 7],
                  <<"output_size_hint">> => 1}),
    Ok = #{<<"status">> => 200, <<"body">> => <<2, 6, 10, 14>>,
           <<"content-type">> => <<"application/octet-stream">>},
    %% Direct hb_ao:resolve: body only in Msg2. HTTP: in both. Old callers: Msg1.
    ?assertEqual({ok, Ok}, reply(dev_kem:execute_kernel(#{}, #{<<"body">> => Body}, #{}))),
    ?assertEqual({ok, Ok}, reply(dev_kem:execute_kernel(#{<<"body">> => Body}, #{<<"body">> => Body}, #{}))),
    ?assertEqual({ok, Ok}, reply(dev_kem:execute_kernel(#{<<"body">> => Body}, #{}, #{}))),
    %% Hint defaults to 1; fields may be message keys.
    NoHint = body(#{<<"kernel_id">> => ?DOUBLE, <<"input_data">> => [1, 3, 5, 7]}),
    ?assertEqual({ok, Ok}, reply(dev_kem:execute_kernel(#{}, #{<<"body">> => NoHint}, #{}))),
    ?assertEqual({ok, Ok}, reply(dev_kem:execute_kernel(#{}, #{<<"kernel_id">> => ?DOUBLE,
                                                               <<"input_data">> => [1, 3, 5, 7]}, #{}))),
    Input = [X rem 256 || X <- lists:seq(1, 400)],
    Image = list_to_binary(Input),
    WithParams = body(#{<<"kernel_id">> => <<"pixelize">>, <<"input_data">> => Input,
                        <<"params">> => [10, 10, 1, 0]}),
    %% pixel_size 1: every block is one pixel, the image comes back as is.
    ?assertMatch({ok, #{<<"status">> := 200, <<"body">> := Image}},
                 dev_kem:execute_kernel_with_params(#{}, #{<<"body">> => WithParams}, #{})).

dev_kem_bad_requests() ->
    Bad = fun(Body) -> dev_kem:execute_kernel(#{}, #{<<"body">> => Body}, #{}) end,
    Status = fun({error, #{<<"status">> := S}}) -> S end,
    ?assertEqual(400, Status(Bad(<<"{not json">>))),
    ?assertEqual(400, Status(Bad(<<"[1,2]">>))),
    ?assertEqual(400, Status(Bad(body(#{<<"input_data">> => [1]})))),
    ?assertEqual(400, Status(Bad(body(#{<<"kernel_id">> => ?DOUBLE})))),
    ?assertEqual(400, Status(Bad(body(#{<<"kernel_id">> => ?DOUBLE, <<"input_data">> => [1, 256]})))),
    ?assertEqual(400, Status(Bad(body(#{<<"kernel_id">> => ?DOUBLE, <<"input_data">> => [1],
                                        <<"output_size_hint">> => 0})))),
    ?assertEqual(400, Status(Bad(body(#{<<"kernel_id">> => <<"a/b">>, <<"input_data">> => [1]})))),
    %% Not 404: HyperBEAM swaps every 404 reply for its HTML page (docs/hyperbeam.md).
    ?assertEqual(400, Status(Bad(body(#{<<"kernel_id">> => <<"nope">>, <<"input_data">> => [1]})))),
    ?assertEqual(400, Status(dev_kem:execute_kernel(#{}, #{}, #{}))),
    {error, #{<<"body">> := Json, <<"content-type">> := <<"application/json">>,
              <<"reason">> := <<"kernel_not_found">>}} =
        Bad(body(#{<<"kernel_id">> => <<"nope">>, <<"input_data">> => [1]})),
    {ok, #{<<"error">> := _, <<"reason">> := <<"kernel_not_found">>, <<"details">> := D}} =
        kem_json:decode(Json),
    ?assert(is_binary(D)),
    NoParams = body(#{<<"kernel_id">> => <<"pixelize">>, <<"input_data">> => [1, 2, 3, 4]}),
    ?assertEqual(400, Status(dev_kem:execute_kernel_with_params(#{}, #{<<"body">> => NoParams}, #{}))).

dev_kem_info() ->
    ?assertEqual(#{exports => [info, execute_kernel, execute_kernel_with_params, get_adapter_info,
                               execute_chain, run, dashboard, dashboard_data]},
                 dev_kem:info(#{})),
    {ok, #{<<"status">> := 200, <<"body">> := InfoJson}} = dev_kem:info(#{}, #{}, #{}),
    ?assertMatch({ok, #{<<"version">> := <<"1.0">>}}, kem_json:decode(InfoJson)),
    {ok, #{<<"status">> := 200, <<"body">> := Json}} = dev_kem:get_adapter_info(#{}, #{}, #{}),
    ?assertMatch({ok, #{<<"backend">> := _}}, kem_json:decode(Json)).

lua_example_body_is_accepted() ->
    {ok, Lua} = file:read_file(filename:join(kem_test_app:repo_root(), "examples/kem-device.lua")),
    {match, [Body]} = re:run(Lua, "KEM_REQUEST_BODY = '([^']*)'", [{capture, all_but_first, binary}]),
    %% As ao.resolve delivers it: device, method and body are global-scope
    %% keys, present on the base message and on the request.
    Req = #{<<"device">> => <<"kem@1.0">>, <<"method">> => <<"POST">>, <<"body">> => Body},
    ?assertMatch({ok, #{<<"status">> := 200, <<"body">> := <<2, 6, 10, 14>>}},
                 dev_kem:execute_kernel(Req, Req#{<<"path">> => <<"execute_kernel">>}, #{})).

%%% shared-memory side channel

%% The payload files (the directory also holds its `owner' file).
shm_files() ->
    {ok, Files} = file:list_dir(kem_shm_dir:path()),
    Files -- ["owner"].

large_payloads_go_through_shared_memory() ->
    {ok, #{kem_port_1 := Before}} = kem:stats(),
    Input = random_bytes((3 bsl 20) + 5),
    ?assertEqual(double_ref(Input, byte_size(Input) * 2), kem_nif:execute_kernel(?DOUBLE, Input, 2)),
    ?assertEqual({ok, double_ref(Input, 7)}, kem:execute(?DOUBLE, Input, #{output_size => 7})),
    {W, H} = {1024, 1024},
    Image = binary:copy(<<9, 8, 7, 6>>, W * H),
    ?assertEqual(Image, kem_nif:execute_kernel_with_params(<<"pixelize">>, Image,
                                                           <<W:32/little, H:32/little, 4:32/little, 0:32>>)),
    ?assertEqual([], shm_files()),
    {ok, #{kem_port_1 := After}} = kem:stats(),
    %% The inputs did not cross the pipe: the port read them from files.
    ?assert(maps:get(bytes_in, After) - maps:get(bytes_in, Before) >= 3 * (3 bsl 20)),
    %% Errors come back the same way, files gone too.
    ?assertMatch({error, {kernel_not_found, _}}, kem:execute(<<"nope">>, Input, #{})),
    ?assertEqual([], shm_files()).

shared_memory_files_removed_when_port_killed() ->
    [Port] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    Parent = self(),
    Big = random_bytes(32 bsl 20),
    Callers = [spawn_link(fun() -> Parent ! {self(), kem:execute(?DOUBLE, Big, #{})} end) || _ <- lists:seq(1, 4)],
    timer:sleep(150),
    os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    Results = [receive {P, R} -> R after 20000 -> no_reply end || P <- Callers],
    ?assertEqual([], [R || R <- Results, R =:= no_reply]),
    ?assertEqual([], [R || {ok, Out} = R <- Results, Out =/= double_ref(Big, byte_size(Big))]),
    %% A caller still writing its 32 MiB input when the kill came (a loaded
    %% machine: a stress run saw it) is answered by the restarted port, and a
    %% slot's files are kept after a call the port answered (kem_shm_slots):
    %% then only slot files may remain, never a one-off file; with every
    %% call lost to the kill, nothing.
    Lost = [R || {error, {Reason, _}} = R <- Results, lists:member(Reason, [timeout, port_exited, port_restarted])],
    {SlotFiles, Others} = lists:partition(fun(F) -> lists:prefix("slot", F) end, shm_files()),
    ?assertEqual([], Others),
    case length(Lost) =:= length(Results) of
        true -> ?assertEqual({[], Results}, {SlotFiles, Results});
        false -> ok
    end,
    ?assertEqual(ok, kem_test_app:wait_for_service(5000)).

stale_shared_memory_dirs_are_swept() ->
    %% A directory left by a node that died (no such process) goes at start;
    %% it is provably ours: private, with an owner file (kem_shm_tests has
    %% the cases that are not). Under a root of this run's own: CI runs the
    %% OTP 25 and 27 suites at once, and a shared name met `eexist'.
    Root = "/dev/shm/kemtest-" ++ os:getpid() ++ "-" ++ integer_to_list(erlang:unique_integer([positive])),
    ok = file:make_dir(Root),
    Stale = filename:join(Root, "kem-999999999"),
    ok = file:make_dir(Stale),
    ok = file:change_mode(Stale, 8#700),
    ok = kem_shm_dir:write_private(filename:join(Stale, "owner"), <<"999999999 1\n">>),
    ok = file:write_file(filename:join(Stale, "1.in"), <<"left behind">>),
    {ok, Uid} = kem_shm_dir:own_uid(),
    Swept = kem_shm_dir:sweep(Root, Uid),
    ok = file:del_dir(Root),
    ?assertEqual(1, Swept),
    ?assertNot(filelib:is_dir(Stale)),
    ?assert(filelib:is_dir(kem_shm_dir:path())).

%%% concurrency and faults

fifty_callers_twenty_calls_each() ->
    Parent = self(),
    Pids = [spawn_link(fun() -> Parent ! {self(), caller(20)} end) || _ <- lists:seq(1, 50)],
    Results = [receive {P, R} -> R after 240000 -> timeout end || P <- Pids],
    ?assertEqual(lists:duplicate(50, ok), Results).

caller(0) -> ok;
caller(N) ->
    Input = random_bytes(1 + rand:uniform(2000)),
    Hint = rand:uniform(3),
    case kem:execute(?DOUBLE, Input, #{output_size_hint => Hint}) of
        {ok, Out} ->
            case double_ref(Input, byte_size(Input) * Hint) of
                Out -> caller(N - 1);
                _ -> {wrong_answer, Input, Hint}
            end;
        Error -> Error
    end.

kill_port_with_calls_in_flight() ->
    [Port] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    Parent = self(),
    Big = random_bytes(4 bsl 20),
    %% The GPU held first, so calls are still in flight at the kill: on a
    %% loaded machine the port once answered all 100 before it came.
    _ = spawn(fun() -> kem:call(test_hook, {sleep_gpu, 5000}, 20000) end),
    ?assertEqual(ok, all_reached(Port, 1, erlang:monotonic_time(millisecond) + 5000)),
    Callers = [spawn_link(fun() -> Parent ! {self(), kem:execute(?DOUBLE, Big, #{})} end)
               || _ <- lists:seq(1, 100)],
    %% Kill only when every caller has reached the port (or been answered),
    %% the hold among the pending: a caller still writing its input file is
    %% not in flight yet, and would be served by the restarted port.
    ?assertEqual(ok, all_reached(Port, 101, erlang:monotonic_time(millisecond) + 20000)),
    Killed = erlang:monotonic_time(millisecond),
    os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    Results = [receive {P, R} -> R after 10000 -> no_reply end || P <- Callers],
    LastAnswer = erlang:monotonic_time(millisecond) - Killed,
    Errors = [R || {error, _} = R <- Results],
    Good = [R || {ok, Out} = R <- Results, Out =:= double_ref(Big, byte_size(Big))],
    Other = [R || R <- Results, element(1, R) =/= error, not lists:member(R, Good)],
    ?assertEqual([], [case R of {ok, _} -> wrong_answer; _ -> R end || R <- Other]),
    %% Every caller is answered: an error, or (if it finished before the
    %% kill) the right bytes; never a wrong answer, never silence.
    io:format(user, "~nkill: ~p errors, ~p good, ~p other; last answer after ~p ms~n", [length(Errors), length(Good), [R || R <- Results, not is_tuple(R)], LastAnswer]),
    ?assertEqual(100, length(Errors) + length(Good)),
    ?assert(length(Errors) > 0),
    %% Each error is the death itself, not a deadline: the owner failed
    %% every waiting caller when the port went. The bound only says "not
    %% the 30 s call timeout": it is the OS's time from kill -9 to the
    %% closed pipe plus 100 replies, under 1 s alone, 1.1 s once with two
    %% eunit VMs and pytest on 2 cores (a 1 s bound failed there).
    ?assertEqual([], [E || {error, {Reason, _}} = E <- Errors, Reason =/= port_exited]),
    ?assert(LastAnswer < 5000),
    ?assertEqual(ok, kem_test_app:wait_for_service(5000)),
    ?assertNotEqual(OsPid, kem_port:os_pid(Port)),
    ?assertEqual(<<2, 6, 10, 14>>, kem_nif:execute_kernel(?DOUBLE, <<1, 3, 5, 7>>, 1)).

all_reached(Port, N, Deadline) ->
    #{pending := Pending} = sys:get_state(Port),
    {message_queue_len, Answered} = process_info(self(), message_queue_len),
    case maps:size(Pending) + Answered >= N of
        true -> ok;
        false ->
            case erlang:monotonic_time(millisecond) > Deadline of
                true -> {timeout, maps:size(Pending), Answered};
                false -> timer:sleep(2), all_reached(Port, N, Deadline)
            end
    end.

call_outliving_its_timeout() ->
    [Port] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    ?assertMatch({error, {timeout, _}}, kem:call(test_hook, {sleep_gpu, 5000}, 1000)),  % 1 s: on the GPU by then, under load too
    ?assertEqual(ok, kem_test_app:wait_for_service(5000)),
    ?assertNotEqual(OsPid, kem_port:os_pid(Port)),
    ?assertEqual(<<2, 6, 10, 14>>, kem_nif:execute_kernel(?DOUBLE, <<1, 3, 5, 7>>, 1)).

stats_count_calls() ->
    {ok, #{kem_port_1 := Before}} = kem:stats(),
    _ = kem_nif:execute_kernel(?DOUBLE, <<1, 3, 5, 7>>, 1),
    {ok, #{kem_port_1 := After}} = kem:stats(),
    ?assertEqual(2, maps:get(calls, After) - maps:get(calls, Before)).
