%%% @doc Which local port runs a call: port groups, one per adapter
%%% (kem_adapters), kernel affinity, spill to the least loaded.
%%%
%%% Within a group a call goes to the least loaded live port, ties to the
%%% first: a lone caller always finds the first port idle and stays there,
%%% so a second port costs a lone call nothing (two processes taking turns
%%% on one GPU doubled the lone latency under round robin,
%%% docs/benchmarks.md), while many callers spread over every port, each
%%% with its own GIL (docs/cluster.md, "Placement"). With several groups, a kernel id
%%% goes to the group `phash2(KernelId)' names, to the least loaded port there, so its
%%% pipeline stays warm on one device; when even that port has ?SPILL_AT
%%% calls in flight (times the group's weight) the call spills to the least
%%% loaded port of any group (load divided by weight). Calls without a
%%% kernel (ping, adapter_info) go round robin over every port.
%%%
%%% Load is one `atomics' slot per port, bumped by the calling process
%%% around each call (`pick/1', `done/3'); per-group counters (calls,
%%% latency, errors) are a `counters' array with write_concurrency: each
%%% scheduler bumps its own copy, where an ETS row per group made every
%%% caller of a group update the same row (docs/benchmarks.md, "BEAM CPU
%%% per call (issue 28)"). Both are made by `setup/2' in kem_sup's init.
-module(kem_place).
-export([setup/2, pick/1, done/3, pending/0, groups/0, group_envs/0, group_of/1]).

-define(KEY, {kem, place}).
%% A group's slots in the `stats' counters: calls, latency_us, errors.
-define(CALLS(G), (3 * (G) - 2)).
-define(LATENCY_US(G), (3 * (G) - 1)).
-define(ERRORS(G), (3 * (G))).
%% Calls in flight on a port before its group counts as overloaded. Not
%% measured: a port drains a queue of small calls in one batch
%% (docs/executor.md), so a few in flight are normal; past 16 a cold
%% pipeline elsewhere (a compile, ms) costs less than the wait.
-define(SPILL_AT, 16).

-type group() :: kem_adapters:group().
-type port_spec() :: {Name :: atom(), Env :: [{string(), string()}]}.

%% @doc Number the ports of every group (`kem_port_1'...), remember the
%% groups, and return each port's name and extra environment.
-spec setup([group()], pos_integer() | auto) -> [port_spec()].
setup(Groups, PortsSetting) ->
    Specs = [{G, Group} || {G, Group} <- lists:zip(lists:seq(1, length(Groups)), Groups)],
    Ports = [{G, Group} || {G, Group} <- Specs, _ <- lists:seq(1, kem_adapters:ports_for(Group, PortsSetting))],
    Names = [port_name(I) || I <- lists:seq(1, length(Ports))],
    Table = [{G, [I || {I, {G1, _}} <- lists:zip(lists:seq(1, length(Ports)), Ports), G1 =:= G], Group}
             || {G, Group} <- Specs],
    Load = atomics:new(max(1, length(Ports)), [{signed, true}]),
    Stats = counters:new(max(1, 3 * length(Groups)), [write_concurrency]),
    RR = atomics:new(1, [{signed, false}]),
    persistent_term:put(?KEY, #{groups => list_to_tuple([{list_to_tuple(Is), weight(Group)} || {_, Is, Group} <- Table]),
                                described => [{G, Is, Group} || {G, Is, Group} <- Table],
                                group_of => list_to_tuple([G || {G, _} <- Ports]),
                                names => list_to_tuple(Names), load => Load, rr => RR, stats => Stats}),
    %% kem's own key, read by kem_metrics and kem_cluster: every port name.
    persistent_term:put({kem, ports}, {list_to_tuple(Names), RR}),
    [{Name, kem_adapters:port_env(Group)} || {Name, {_, Group}} <- lists:zip(Names, Ports)].

%% @doc The port for a call on KernelId (`undefined': no kernel), counted
%% as in flight until `done/3'.
-spec pick(binary() | undefined) -> {ok, pos_integer(), atom()} | {error, kem_port:reason()}.
pick(Key) ->
    case persistent_term:get(?KEY, undefined) of
        undefined ->
            {error, {not_started, <<"application kem is not running">>}};
        #{names := {}} ->
            {error, {no_local_gpu, <<"this node runs no kem ports">>}};
        Place = #{names := Names, load := Load} ->
            I = choose(Key, Place),
            atomics:add(Load, I, 1),
            {ok, I, element(I, Names)}
    end.

%% @doc The call picked as port I ended with Reply after Us µs.
-spec done(pos_integer(), {ok, term()} | {error, term()}, non_neg_integer()) -> ok.
done(I, Reply, Us) ->
    case persistent_term:get(?KEY, undefined) of
        #{load := Load, group_of := GroupOf, stats := Stats} ->
            atomics:sub(Load, I, 1),
            G = element(I, GroupOf),
            counters:add(Stats, ?CALLS(G), 1),
            counters:add(Stats, ?LATENCY_US(G), Us),
            case Reply of
                {ok, _} -> ok;
                _ -> counters:add(Stats, ?ERRORS(G), 1)
            end;
        undefined ->
            %% The app stopped while the call ran.
            ok
    end.

%% @doc Calls in flight on this node's ports now.
-spec pending() -> non_neg_integer().
pending() ->
    case persistent_term:get(?KEY, undefined) of
        #{load := Load, names := Names} -> lists:sum([atomics:get(Load, I) || I <- lists:seq(1, tuple_size(Names))]);
        undefined -> 0
    end.

%% @doc Every group with its adapter, ports and state (for `kem:adapters/0').
-spec groups() -> [map()].
groups() ->
    case persistent_term:get(?KEY, undefined) of
        undefined -> [];
        #{described := Described, names := Names, load := Load, stats := Stats} ->
            [Group#{group => G,
                    ports => [element(I, Names) || I <- Is],
                    live => length([I || I <- Is, whereis(element(I, Names)) =/= undefined]),
                    state => state(Is, Names),
                    pending => lists:sum([atomics:get(Load, I) || I <- Is]),
                    calls => counters:get(Stats, ?CALLS(G)), errors => counters:get(Stats, ?ERRORS(G)),
                    latency_us => counters:get(Stats, ?LATENCY_US(G))}
             || {G, Is, Group} <- Described]
    end.

%% @doc Each group's number and the environment its ports get (its
%% `KEM_ADAPTER'), for the spares kem_spare keeps per group.
-spec group_envs() -> [{pos_integer(), [{string(), string()}]}].
group_envs() ->
    case persistent_term:get(?KEY, undefined) of
        undefined -> [];
        #{described := Described} -> [{G, kem_adapters:port_env(Group)} || {G, _, Group} <- Described]
    end.

%% @doc The group of the port registered as Name (`undefined': not one of
%% kem_sup's ports).
-spec group_of(atom()) -> pos_integer() | undefined.
group_of(Name) ->
    case persistent_term:get(?KEY, undefined) of
        #{names := Names, group_of := GroupOf} -> index_group(Name, tuple_to_list(Names), 1, GroupOf);
        undefined -> undefined
    end.

%%% internals

index_group(_Name, [], _I, _GroupOf) -> undefined;
index_group(Name, [Name | _], I, GroupOf) -> element(I, GroupOf);
index_group(Name, [_ | Rest], I, GroupOf) -> index_group(Name, Rest, I + 1, GroupOf).

choose(_Key, #{groups := {{Ports, _}}, load := Load, names := Names}) ->
    case least_loaded(Ports, Load, Names) of
        {_Pending, I} -> I;
        none -> element(1, Ports)  % all restarting: its caller hears why
    end;
choose(undefined, #{names := Names, rr := RR}) ->
    1 + atomics:add_get(RR, 1, 1) rem tuple_size(Names);
choose(Key, #{groups := Groups, load := Load, names := Names}) ->
    {Home, Weight} = element(erlang:phash2(Key, tuple_size(Groups)) + 1, Groups),
    case least_loaded(Home, Load, Names) of
        {Pending, I} when Pending < ?SPILL_AT * Weight -> I;
        _Overloaded_or_down -> spill(Groups, Load, Names, element(1, Home))
    end.

%% The least loaded live port of any group, load divided by the group's
%% weight; with none live, Fallback (its caller then hears why).
spill(Groups, Load, Names, Fallback) ->
    case [{Pending / Weight, I} || {Ports, Weight} <- tuple_to_list(Groups),
                                   {Pending, I} <- [least_loaded(Ports, Load, Names)]] of
        [] -> Fallback;
        Live -> element(2, lists:min(Live))
    end.

%% `{Pending, I}' of the live port with the fewest calls in flight, or
%% `none' when every port of the group is down (restarting).
least_loaded(Ports, Load, Names) ->
    case [{atomics:get(Load, I), I} || I <- tuple_to_list(Ports), whereis(element(I, Names)) =/= undefined] of
        [] -> none;
        Live -> lists:min(Live)
    end.

state(Is, Names) ->
    case length([I || I <- Is, whereis(element(I, Names)) =/= undefined]) of
        0 -> down;
        N when N =:= length(Is) -> up;
        _ -> degraded
    end.

weight(#{weight := W}) -> W.

port_name(I) ->
    list_to_atom("kem_port_" ++ integer_to_list(I)).
