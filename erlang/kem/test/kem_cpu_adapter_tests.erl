%%% @doc A node on a CPU adapter says so, and blames the right choice.
%%% Vulkan is held to Mesa's lavapipe (its ICD file only), so discovery finds
%%% one CPU adapter on any machine, GPU or not. Then: the app pins that
%%% adapter, `kem:health/0''s reason says the node's only adapter is a CPU
%%% implementation (not "KEM_ADAPTER='0'", which nobody set), and the node
%%% logs one OTP logger warning per port group, none for a restarted port.
-module(kem_cpu_adapter_tests).
-include_lib("eunit/include/eunit.hrl").

%% logger handler callback (this module is the test handler)
-export([log/2]).

-define(COLLECTOR, kem_cpu_adapter_log).

discovered_cpu_test_() ->
    {setup, fun() -> start([]) end, fun stop/1,
     {timeout, 120, fun discovered_cpu_is_one_warning_and_an_honest_reason/0}}.

configured_cpu_test_() ->
    %% Two groups of two ports on adapter 0, by the operator's `adapters'.
    {setup, fun() -> start([{adapters, [0, 0]}, {ports, 2}]) end, fun stop/1,
     {timeout, 120, fun configured_cpu_is_one_warning_per_group/0}}.

discovered_cpu_is_one_warning_and_an_honest_reason() ->
    ?assertMatch([#{type := <<"CPU">>, adapter := 0}], kem:adapters()),
    {ok, #{kem_port_1 := Health}} = kem:health(),
    ?assertMatch(#{usable := true, kind := <<"cpu">>}, Health),
    Reason = maps:get(reason, Health),
    ?assertEqual(nomatch, binary:match(Reason, <<"KEM_ADAPTER">>)),
    ?assertMatch({0, _}, binary:match(Reason, <<"the node's only adapter is a CPU implementation, ">>)),
    [Warning] = warnings(),
    ?assertEqual({1, <<"kem: port group 1 runs on a CPU adapter: ", Reason/binary>>}, Warning),
    ?assertMatch({_, _}, binary:match(Reason, maps:get(adapter, Health))),
    %% A restarted port is no new warning.
    restart(kem_port_1),
    ?assertEqual([], warnings()).

configured_cpu_is_one_warning_per_group() ->
    {ok, Report} = kem:health(),
    ?assertEqual(4, map_size(Report)),
    [?assertMatch({0, _}, binary:match(R, <<"the node's `adapters` setting chose adapter 0, ">>))
     || #{reason := R} <- maps:values(Report)],
    ?assertEqual([1, 2], lists:sort([G || {G, _} <- warnings()])),
    restart(kem_port_3),
    ?assertEqual([], warnings()).

%%% helpers

start(Env) ->
    Icd = case filelib:wildcard("/usr/share/vulkan/icd.d/lvp_icd*.json") of
        [File | _] -> File;
        [] -> error({no_lavapipe, "Mesa's lavapipe ICD is missing: scripts/setup installs mesa-vulkan-drivers"})
    end,
    %% The warnings come while the app starts, in eunit's setup process,
    %% not the test's: a collector keeps them until the test asks.
    Collector = spawn(fun() -> collect([]) end),
    register(?COLLECTOR, Collector),
    ok = logger:add_handler(?MODULE, ?MODULE, #{level => warning, config => #{pid => Collector}}),
    kem_test_app:start([{port_env, [{"VK_ICD_FILENAMES", Icd}, {"VK_DRIVER_FILES", Icd}]} | Env]).

stop(Apps) ->
    logger:remove_handler(?MODULE),
    exit(whereis(?COLLECTOR), kill),
    kem_test_app:stop(Apps).

collect(Events) ->
    receive
        {logged, Event} -> collect([Event | Events]);
        {take, Pid} -> Pid ! {events, lists:reverse(Events)}, collect([])
    end.

log(Event, #{config := #{pid := Pid}}) ->
    Pid ! {logged, Event}.

%% The CPU warnings logged so far (and not taken before), as {Group, Text}.
warnings() ->
    timer:sleep(200),  % a warning logged just now reaches the collector
    ?COLLECTOR ! {take, self()},
    Events = receive {events, E} -> E after 5000 -> error(no_collector) end,
    [{G, iolist_to_binary(io_lib:format(Format, Args))}
     || #{level := warning, msg := {Format, Args}, meta := #{kem_group := G}} <- Events].

%% Kill Name's Python process and wait until a new one serves.
restart(Name) ->
    Old = kem_port:os_pid(Name),
    os:cmd("kill -9 " ++ integer_to_list(Old)),
    ?assertEqual(ok, wait_new(Name, Old, 400)).

wait_new(_Name, _Old, 0) -> timeout;
wait_new(Name, Old, Tries) ->
    timer:sleep(50),
    case catch kem_port:os_pid(Name) of
        New when is_integer(New), New =/= Old ->
            case kem_port:call(Name, ping, {}, 30000) of
                {ok, pong} -> ok;
                _ -> wait_new(Name, Old, Tries - 1)
            end;
        _ -> wait_new(Name, Old, Tries - 1)
    end.
