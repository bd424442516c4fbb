%%% @doc Timeouts that kill only what is stuck, on the real port: a call
%%% waiting for a stalled gateway or in the queue behind other work is
%%% answered `timeout' with what it waited for, and the port (its OS pid)
%%% stays; a call the GPU is inside still gets its port replaced.
-module(kem_timeout_tests).
-include_lib("eunit/include/eunit.hrl").

%% 43 base64url characters that decode to 32 bytes: an Arweave ID shape.
-define(ID, <<"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA">>).

timeout_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 60, fun stalled_gateway_is_answered_and_port_kept/0},
      {timeout, 60, fun queued_call_is_answered_and_port_kept/0},
      {timeout, 60, fun a_call_that_only_waited_is_not_quarantined/0},
      {timeout, 60, fun call_the_gpu_is_inside_restarts_the_port/0},
      {timeout, 60, fun stuck_reader_restarts_the_port/0}]}.

start() ->
    {ok, Listen} = gen_tcp:listen(0, [binary, {active, false}, {reuseaddr, true}, {ip, {127, 0, 0, 1}}]),
    {ok, TcpPort} = inet:port(Listen),
    Stall = spawn(fun() -> stall(Listen, []) end),
    ok = gen_tcp:controlling_process(Listen, Stall),
    Cache = filename:join("/tmp", "kem_timeout_cache_" ++ os:getpid()),
    Apps = kem_test_app:start([{gateways, "http://127.0.0.1:" ++ integer_to_list(TcpPort)}, {cache_dir, Cache},
                               {port_env, [{"KEM_TEST_HOOKS", "1"}]}]),
    {Apps, Stall, Cache}.

stop({Apps, Stall, Cache}) ->
    kem_test_app:stop(Apps),
    exit(Stall, kill),
    file:del_dir_r(Cache),
    ok.

%% A gateway that accepts every connection and never answers.
stall(Listen, Held) ->
    case gen_tcp:accept(Listen) of
        {ok, Socket} -> stall(Listen, [Socket | Held]);
        {error, _} -> ok
    end.

now_ms() -> erlang:monotonic_time(millisecond).

stalled_gateway_is_answered_and_port_kept() ->
    [Port] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    T0 = now_ms(),
    %% 5 s: the port keeps back 10% of it (500 ms) to answer before the
    %% owner's timer; at 1.5 s, 150 ms had to cover the pipe and the port's
    %% read too, which a loaded machine can take.
    Result = kem:execute(?ID, <<1, 2, 3, 4>>, #{timeout => 5000}),
    Took = now_ms() - T0,
    io:format(user, "~nstalled gateway, 5000 ms call timeout: ~p after ~b ms~n", [Result, Took]),
    ?assertMatch({error, {timeout, _}}, Result),
    {error, {timeout, Detail}} = Result,
    ?assertNotEqual(nomatch, binary:match(Detail, <<"GET /tx/", ?ID/binary>>)),
    %% The port answered by itself, before the owner's timer: no probe, no kill.
    ?assert(Took < 5000),
    ?assertEqual(OsPid, kem_port:os_pid(Port)),
    ?assertEqual({ok, <<2, 6, 10, 14>>}, kem:execute(<<"double">>, <<1, 3, 5, 7>>, #{})).

queued_call_is_answered_and_port_kept() ->
    [Port] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    Self = self(),
    spawn_link(fun() -> Self ! {busy, kem:call(test_hook, {sleep_gpu, 3000}, 10000)} end),
    timer:sleep(200),
    %% 1 s: time enough for a loaded machine's port to read the call into
    %% its queue (at 300 ms it could still be unread: `unknown').
    Result = kem:execute(<<"double">>, <<1, 3, 5, 7>>, #{timeout => 1000}),
    ?assertMatch({error, {timeout, _}}, Result),
    {error, {timeout, Detail}} = Result,
    ?assertNotEqual(nomatch, binary:match(Detail, <<"queued behind">>)),
    ?assertNotEqual(nomatch, binary:match(Detail, <<"the port was kept">>)),
    ?assertEqual({busy, {ok, ok}}, receive {busy, _} = B -> B after 10000 -> none end),
    ?assertEqual(OsPid, kem_port:os_pid(Port)),
    ?assertEqual({ok, <<2, 6, 10, 14>>}, kem:execute(<<"double">>, <<1, 3, 5, 7>>, #{})).

%% kem_quarantine refuses a kernel whose call outlived the default timeout;
%% not when the call only waited in the queue behind other work.
a_call_that_only_waited_is_not_quarantined() ->
    {ok, Default} = application:get_env(kem, timeout),
    Self = self(),
    spawn_link(fun() -> Self ! {busy, kem:call(test_hook, {sleep_gpu, 2500}, 10000)} end),
    timer:sleep(200),
    ok = application:set_env(kem, timeout, 1000),
    try
        ?assertMatch({error, {timeout, _}}, kem:execute(<<"double">>, <<1, 3, 5, 7>>, #{})),
        ?assertEqual({busy, {ok, ok}}, receive {busy, _} = B -> B after 10000 -> none end),
        ?assertEqual({ok, <<2, 6, 10, 14>>}, kem:execute(<<"double">>, <<1, 3, 5, 7>>, #{}))
    after
        application:set_env(kem, timeout, Default)
    end.

call_the_gpu_is_inside_restarts_the_port() ->
    [Port] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    %% 1 s for the call to reach the GPU thread, on a loaded machine too.
    Result = kem:call(test_hook, {sleep_gpu, 5000}, 1000),
    ?assertMatch({error, {timeout, _}}, Result),
    {error, {timeout, Detail}} = Result,
    ?assertNotEqual(nomatch, binary:match(Detail, <<"the GPU thread is inside this call; the port was restarted">>)),
    ok = kem_test_app:wait_for_service(10000),
    ?assertNotEqual(OsPid, kem_port:os_pid(Port)).

%% The reader itself stuck (an inline call): the probe goes unanswered.
stuck_reader_restarts_the_port() ->
    [Port] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    T0 = now_ms(),
    Result = kem:call(test_hook, {sleep_reader, 5000}, 300),
    Took = now_ms() - T0,
    ?assertMatch({error, {timeout, _}}, Result),
    {error, {timeout, Detail}} = Result,
    ?assertNotEqual(nomatch, binary:match(Detail, <<"did not say where the call is; it is stuck; the port was restarted">>)),
    %% 300 ms timeout plus the 1000 ms probe_timeout.
    ?assert(Took >= 1300),
    ok = kem_test_app:wait_for_service(10000),
    ?assertNotEqual(OsPid, kem_port:os_pid(Port)).
