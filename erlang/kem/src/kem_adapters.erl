%%% @doc Which adapters this node runs port groups on (docs/cluster.md).
%%%
%%% App env `adapters':
%%% - `auto' (default): ask Python once at start which adapters exist (the
%%%   `kem adapters --json' command, the port's own code); every Vulkan GPU
%%%   gets a group; a CPU adapter only when there is no GPU;
%%% - `none': no local adapter: a front node (as `local_gpus => false');
%%% - `[Index, ...]': these adapter indexes, no discovery; an index given
%%%   twice is two groups on one adapter (the multi-group test setup on a
%%%   machine with one adapter).
%%% `exclude' (indexes) drops adapters; `weights' (`#{Index => W}') scales a
%%% group's share of spilled calls (kem_place). An `adapter' setting (one
%%% adapter pinned, by index or name) keeps the single group it always
%%% meant, as does a discovery that fails or finds nothing: then the port
%%% picks its adapter itself and says why it cannot start, as before.
-module(kem_adapters).
-export([groups/0, choose/2, port_env/1, ports_for/2]).

-type group() :: #{adapter := non_neg_integer() | default, name := binary(), weight := pos_integer(),
                   type => binary()}.
-export_type([group/0]).

-define(DEFAULT, #{adapter => default, name => <<"chosen by the port">>, weight => 1}).

%% @doc The port groups to start, in order.
-spec groups() -> [group()].
groups() ->
    case {application:get_env(kem, adapters, auto), application:get_env(kem, adapter, undefined)} of
        {none, _} -> [];
        {Indexes, _} when is_list(Indexes) -> [group(I, <<"configured">>) || I <- Indexes];
        {auto, undefined} -> discovered();
        {auto, _Pinned} -> [?DEFAULT]
    end.

%% @doc The groups `auto' makes of a discovery's adapter list (the JSON
%% objects of `kem adapters --json'): Vulkan GPUs; else one CPU adapter;
%% else the port's own choice.
-spec choose([map()], [non_neg_integer()]) -> [group()].
choose(Adapters, Exclude) ->
    Usable = [A || A = #{<<"index">> := I} <- Adapters, not lists:member(I, Exclude)],
    Vulkan = [A || A = #{<<"backend">> := <<"Vulkan">>} <- Usable],
    case {[A || A <- Vulkan, maps:get(<<"type">>, A, <<>>) =/= <<"CPU">>], Vulkan} of
        {[_ | _] = Gpus, _} -> [from_json(A) || A <- Gpus];
        {[], [Cpu | _]} -> [from_json(Cpu)];
        {[], []} -> [?DEFAULT]
    end.

%% @doc The environment a port of Group gets on top of the settings: its
%% adapter, and who chose it (KEM_ADAPTER_PINNED_BY), so a port on a CPU
%% adapter blames the choice that was made (discovery's, or the `adapters'
%% list's; only discovery's groups carry a `type'), not a KEM_ADAPTER that
%% the operator never set (kem_port/port/health.py).
-spec port_env(group()) -> [{string(), string()}].
port_env(#{adapter := default}) -> [];
port_env(#{adapter := I} = Group) ->
    By = case maps:is_key(type, Group) of true -> "discovery"; false -> "adapters" end,
    [{"KEM_ADAPTER", integer_to_list(I)}, {"KEM_ADAPTER_PINNED_BY", By}].

%% @doc How many ports Group gets under the `ports' setting: a number as
%% given; `auto' two on a discrete GPU, one otherwise. One port's GIL
%% bounds its small calls near 30k/s on an H100 while the GPU has room;
%% a second port, placed least loaded (kem_place), took 64 callers from
%% 28.6-33.5k to 43.6-44.2k calls/s with no cost to a lone call. A third
%% gives small calls no more, and chains and named calls more (64
%% callers of 10-step chains 5.2-7.1k -> 8.7-9.3k/s), but on two GPUs
%% three ports a group kept more calls at home before spilling: 64
%% callers of small calls fell to 33.6k, below one GPU's 35.7k
%% (docs/benchmarks.md, "Ports per GPU"). So two stays the default and a
%% chain-heavy node sets `ports'. A CPU adapter has no such headroom, and
%% a group whose type discovery did not report (configured indexes, a
%% pinned adapter) keeps one.
-spec ports_for(group(), pos_integer() | auto) -> pos_integer().
ports_for(_Group, N) when is_integer(N) -> N;
ports_for(#{type := <<"DiscreteGPU">>}, auto) -> 2;
ports_for(_Group, auto) -> 1.

%%% internals

discovered() ->
    case run_discovery() of
        {ok, [], Why} ->
            logger:warning("kem: adapter discovery found no adapter (~ts); one port group, the port picks", [Why]),
            [?DEFAULT];
        {ok, Adapters, _Why} -> choose(Adapters, application:get_env(kem, exclude, []));
        {error, Why} ->
            logger:warning("kem: adapter discovery failed (~0p); one port group, the port picks", [Why]),
            [?DEFAULT]
    end.

group(I, Name) when is_integer(I), I >= 0 ->
    #{adapter => I, name => Name, weight => weight_of(I)};
group(Other, _) ->
    error({bad_config, {adapters, Other}}).

from_json(A = #{<<"index">> := I}) ->
    #{adapter => I, name => maps:get(<<"name">>, A, <<>>), weight => weight_of(I),
      type => maps:get(<<"type">>, A, <<>>)}.

weight_of(I) ->
    case maps:get(I, application:get_env(kem, weights, #{}), 1) of
        W when is_integer(W), W >= 1 -> W;
        Other -> error({bad_config, {weights, I, Other}})
    end.

%% `python -m kem_port.cli adapters --json', with the ports' settings.
run_discovery() ->
    Timeout = application:get_env(kem, start_timeout, 60000),
    try open_port({spawn_executable, kem_python:executable()},
                  [binary, exit_status, use_stdio, hide, {line, 1 bsl 20},
                   {args, ["-m", "kem_port.cli", "adapters", "--json"]},
                   {env, kem_settings:port_env()}]) of
        Port -> collect(Port, [], erlang:monotonic_time(millisecond) + Timeout)
    catch
        error:Reason -> {error, {not_startable, Reason}}
    end.

collect(Port, Acc, Until) ->
    receive
        {Port, {data, {_, Line}}} -> collect(Port, [Line | Acc], Until);
        {Port, {exit_status, 0}} -> parse(iolist_to_binary(lists:reverse(Acc)));
        {Port, {exit_status, S}} -> {error, {exit_status, S}}
    after max(0, Until - erlang:monotonic_time(millisecond)) ->
        catch port_close(Port),
        {error, timeout}
    end.

parse(Json) ->
    case kem_json:decode(Json) of
        {ok, #{<<"adapters">> := Adapters} = Listing} when is_list(Adapters) ->
            Why = maps:get(<<"why">>, Listing, <<>>),
            {ok, Adapters, case is_binary(Why) of true -> Why; false -> <<"no reason given">> end};
        _ -> {error, not_json}
    end.

%%% Tests

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

choose_test() ->
    Cpu = #{<<"index">> => 0, <<"type">> => <<"CPU">>, <<"backend">> => <<"Vulkan">>, <<"name">> => <<"llvmpipe">>},
    Gl = #{<<"index">> => 1, <<"type">> => <<"CPU">>, <<"backend">> => <<"OpenGL">>},
    Gpu = fun(I) -> #{<<"index">> => I, <<"type">> => <<"DiscreteGPU">>, <<"backend">> => <<"Vulkan">>,
                      <<"name">> => <<"H200">>} end,
    ?assertMatch([#{adapter := 0, name := <<"llvmpipe">>}], choose([Cpu, Gl], [])),
    ?assertMatch([#{adapter := 2}, #{adapter := 3}], choose([Cpu, Gpu(2), Gpu(3), Gl], [])),
    ?assertMatch([#{adapter := 3}], choose([Cpu, Gpu(2), Gpu(3)], [2])),
    ?assertEqual([?DEFAULT], choose([Gl], [])),
    ?assertEqual([{"KEM_ADAPTER", "2"}, {"KEM_ADAPTER_PINNED_BY", "adapters"}],
                 port_env(#{adapter => 2, name => <<>>, weight => 1})),
    [Llvmpipe] = choose([Cpu], []),
    ?assertEqual([{"KEM_ADAPTER", "0"}, {"KEM_ADAPTER_PINNED_BY", "discovery"}], port_env(Llvmpipe)),
    ?assertEqual([], port_env(?DEFAULT)).

ports_for_test() ->
    [Discrete] = choose([#{<<"index">> => 0, <<"type">> => <<"DiscreteGPU">>, <<"backend">> => <<"Vulkan">>}], []),
    [Integrated] = choose([#{<<"index">> => 0, <<"type">> => <<"IntegratedGPU">>, <<"backend">> => <<"Vulkan">>}], []),
    [Cpu] = choose([#{<<"index">> => 0, <<"type">> => <<"CPU">>, <<"backend">> => <<"Vulkan">>}], []),
    ?assertEqual([2, 1, 1, 1], [ports_for(G, auto) || G <- [Discrete, Integrated, Cpu, ?DEFAULT]]),
    ?assertEqual([3, 3], [ports_for(G, 3) || G <- [Discrete, Cpu]]).
-endif.
