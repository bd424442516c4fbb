%%% @doc Port groups on one node: two groups configured on the same adapter
%%% index (`adapters => [0, 0]', the test setup on a machine with one
%%% adapter), kernel affinity and spill, checked with real ports.
-module(kem_place_tests).
-include_lib("eunit/include/eunit.hrl").

-define(DOUBLE, <<"double">>).

place_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 60, fun two_groups_are_listed/0},
      {timeout, 60, fun one_kernel_stays_in_its_group/0},
      {timeout, 120, fun a_flood_spills_to_the_other_group/0},
      {timeout, 60, fun a_group_down_is_shown/0}]}.

start() ->
    kem_test_app:start([{adapters, [0, 0]}, {weights, #{0 => 1}}]).

stop(Apps) ->
    kem_test_app:stop(Apps).

%% One group of two ports on one adapter: least loaded, ties to the first.
two_ports_test_() ->
    {setup, fun() -> kem_test_app:start([{ports, 2}]) end, fun stop/1,
     [{timeout, 60, fun a_lone_caller_stays_on_the_first_port/0},
      {timeout, 120, fun many_callers_use_both_ports/0}]}.

calls_by_port() ->
    {ok, Stats} = kem:stats(),
    [maps:get(calls, maps:get(Port, Stats)) || Port <- [kem_port_1, kem_port_2]].

%% Each port's calls since Before, less the stats call of this reading
%% (each port counts the stats call it answers).
calls_since(Before) ->
    lists:zipwith(fun(A, B) -> A - B - 1 end, calls_by_port(), Before).

%% One call at a time always finds the first port idle: the second port
%% takes none (round robin would have given it half).
a_lone_caller_stays_on_the_first_port() ->
    Before = calls_by_port(),
    [begin
         Input = crypto:strong_rand_bytes(Size),
         ?assertEqual({ok, kem_ref:double_ref(Input, Size)}, kem:execute(?DOUBLE, Input, #{}))
     end || Size <- lists:seq(1, 40)],
    ?assertEqual([40, 0], calls_since(Before)).

%% 32 callers at once: the first port's calls in flight push the rest onto
%% the second, and every result is right.
many_callers_use_both_ports() ->
    Before = calls_by_port(),
    Self = self(),
    Pids = [spawn_link(fun() ->
                Results = [begin
                               Size = rand:uniform(4096),
                               Input = crypto:strong_rand_bytes(Size),
                               kem:execute(?DOUBLE, Input, #{}) =:= {ok, kem_ref:double_ref(Input, Size)}
                           end || _ <- lists:seq(1, 10)],
                Self ! {self(), Results}
            end) || _ <- lists:seq(1, 32)],
    Results = lists:append([receive {P, R} -> R end || P <- Pids]),
    ?assertEqual(lists:duplicate(320, true), Results),
    [First, Second] = calls_since(Before),
    ?debugFmt("32 callers x 10 calls over one group of two ports: ~p, ~p", [First, Second]),
    ?assertEqual(320, First + Second),
    ?assert(Second > 0).

calls_by_group() ->
    [maps:get(calls, G) || G <- kem:adapters()].

two_groups_are_listed() ->
    ?assertMatch([#{group := 1, adapter := 0, state := up, live := 1, ports := [kem_port_1]},
                  #{group := 2, adapter := 0, state := up, live := 1, ports := [kem_port_2]}],
                 kem:adapters()),
    %% Each group's port runs on the adapter it was given.
    [begin
         {ok, Json} = kem_port:call(Port, adapter_info, {}, 30000),
         ?assertMatch({ok, #{<<"name">> := _}}, kem_json:decode(Json))
     end || Port <- kem_sup:port_names()].

%% Sequential calls of one kernel all land in the group its id hashes to.
one_kernel_stays_in_its_group() ->
    Before = calls_by_group(),
    [begin
         Input = crypto:strong_rand_bytes(Size),
         ?assertEqual({ok, kem_ref:double_ref(Input, Size)}, kem:execute(?DOUBLE, Input, #{}))
     end || Size <- lists:seq(1, 40)],
    Delta = lists:zipwith(fun(A, B) -> A - B end, calls_by_group(), Before),
    ?assertEqual([0, 40], lists:sort(Delta)),
    %% The same counters in the Prometheus text.
    {ok, Text} = kem:metrics(),
    [?assertMatch({_, _}, binary:match(Text, <<"kem_group_calls_total{group=\"", G/binary, "\",adapter=\"0\"}">>))
     || G <- [<<"1">>, <<"2">>]].

%% Many callers of one kernel at once: past the spill threshold the other
%% group takes calls too, and every result is right.
a_flood_spills_to_the_other_group() ->
    Before = calls_by_group(),
    Self = self(),
    Pids = [spawn_link(fun() ->
                Results = [begin
                               Input = crypto:strong_rand_bytes(4096),
                               kem:execute(?DOUBLE, Input, #{}) =:= {ok, kem_ref:double_ref(Input, 4096)}
                           end || _ <- lists:seq(1, 10)],
                Self ! {self(), Results}
            end) || _ <- lists:seq(1, 64)],
    Results = lists:append([receive {P, R} -> R end || P <- Pids]),
    ?assertEqual(lists:duplicate(640, true), Results),
    Delta = lists:zipwith(fun(A, B) -> A - B end, calls_by_group(), Before),
    ?debugFmt("64 callers x 10 calls of one kernel over two groups: ~p calls per group", [Delta]),
    ?assertEqual(640, lists:sum(Delta)),
    ?assert(lists:min(Delta) > 0).

a_group_down_is_shown() ->
    [_, Port2] = kem_sup:port_names(),
    ok = supervisor:terminate_child(kem_sup, Port2),
    ?assertMatch([#{state := up}, #{state := down, live := 0}], kem:adapters()),
    %% Calls still succeed (the kernel's own group, or a spill).
    ?assertEqual({ok, <<2, 0, 0, 0>>}, kem:execute(?DOUBLE, <<1, 0, 0, 0>>, #{})),
    {ok, _} = supervisor:restart_child(kem_sup, Port2),
    ?assertMatch([#{state := up}, #{state := up}], kem:adapters()).
