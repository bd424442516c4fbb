%%% @doc The dashboard of a front node (docs/cluster.md, docs/dashboard.md):
%%% this VM runs kem without GPUs (`local_gpus => false') and forwards to
%%% one serving node, a real kem with its Python port started with OTP
%%% `peer'. The front's figures show no local port and the serving node
%%% with the calls it was sent; its kernel figures count the forwarded
%%% calls, whose results are checked against kem_ref.
-module(kem_dashboard_cluster_tests).
-include_lib("eunit/include/eunit.hrl").

-define(START_MS, 120000).

front_node_dashboard_test_() ->
    {setup, fun start/0, fun stop/1,
     fun(Cluster) -> [{"front_shows_the_serving_node",
                       {timeout, 120, fun() -> front_shows_the_serving_node(Cluster) end}}] end}.

start() ->
    Distributed = kem_test_app:distribute("kem_dash"),
    Paths = [P || P <- code:get_path(), not lists:prefix(code:lib_dir(), P)],
    {ok, Peer, Serve} = peer:start(#{name => peer:random_name("kem_dash_serve"), args => ["-pa" | Paths]}),
    {ok, _} = erpc:call(Serve, application, ensure_all_started, [kem], ?START_MS),
    Apps = kem_test_app:start([{local_gpus, false}, {cluster_nodes, [Serve]}, {spares, 0}]),
    ok = wait_until(fun() -> kem_cluster:serving_nodes() =:= [Serve] end, 400),
    #{peer => Peer, serve => Serve, apps => Apps, distributed => Distributed}.

stop(#{peer := Peer, apps := Apps, distributed := Distributed}) ->
    kem_test_app:stop(Apps),
    catch peer:stop(Peer),
    kem_test_app:undistribute(Distributed),
    ok.

wait_until(_Pred, 0) -> timeout;
wait_until(Pred, N) ->
    case Pred() of
        true -> ok;
        false -> timer:sleep(50), wait_until(Pred, N - 1)
    end.

front_shows_the_serving_node(#{serve := Serve}) ->
    N = 3 + rand:uniform(6),
    [begin
         Input = crypto:strong_rand_bytes(4 * rand:uniform(256)),
         ?assertEqual({ok, kem_ref:double_ref(Input, byte_size(Input))}, kem:execute(<<"double">>, Input, #{}))
     end || _ <- lists:seq(1, N)],
    {ok, Data} = kem:dashboard_data(),
    ?assertEqual([], maps:get(<<"ports">>, Data)),
    ?assertEqual([], maps:get(<<"adapters">>, Data)),
    [Node] = maps:get(<<"cluster">>, Data),
    ?assertMatch(#{<<"serving">> := true, <<"errors">> := 0, <<"gone">> := 0, <<"pending">> := 0}, Node),
    ?assertEqual(atom_to_binary(Serve), maps:get(<<"node">>, Node)),
    ?assertEqual(N, maps:get(<<"calls">>, Node)),
    ?assert(maps:get(<<"mean_ms">>, Node) > 0),
    [Double] = [K || K <- maps:get(<<"kernels">>, Data), maps:get(<<"kernel">>, K) =:= <<"double">>],
    ?assertEqual(N, maps:get(<<"calls">>, Double)),
    %% The page is made on a front node too, the serving node inside it.
    {ok, Html} = kem:dashboard(),
    ?assertNotEqual(nomatch, binary:match(Html, atom_to_binary(Serve))).
