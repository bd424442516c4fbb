%%% @doc Supervises the port owners: `ports' `kem_port's per adapter group
%%% (kem_adapters picks the adapters, kem_place numbers the ports).
%%% A port that exits (crash, kill, timeout restart) is started again; its
%%% waiting callers have already been answered by its `terminate'.
-module(kem_sup).
-behaviour(supervisor).
-export([start_link/0, init/1, port_names/0]).

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

%% @doc The registered names of the port owners, for `kem' to spread calls.
-spec port_names() -> [atom()].
port_names() ->
    case persistent_term:get({kem, ports}, undefined) of
        undefined -> [];
        {Names, _} -> tuple_to_list(Names)
    end.

init([]) ->
    %% The shared-memory directory is made here and handed to its owner and
    %% to every port owner: no port owner looks it up (kem_shm_dir).
    ShmDir = kem_shm_dir:create(),
    %% One group of `ports' ports per adapter (kem_adapters, kem_place).
    Groups = adapter_groups(),
    Specs = kem_place:setup(Groups, ports_per_group()),
    %% One flag per port, set while it waits for its replacement process.
    persistent_term:put({kem, restarting}, atomics:new(max(1, length(Specs)), [{signed, false}])),
    %% One flag per group, set once it has warned of a CPU adapter
    %% (kem_port_start): one warning per group and app start, not per port.
    persistent_term:put({kem, cpu_warned}, atomics:new(max(1, length(Groups)), [{signed, false}])),
    %% First, so its table outlives every port restart.
    Metrics = #{id => kem_metrics, start => {kem_metrics, start_link, []},
                restart => permanent, shutdown => 5000, type => worker,
                modules => [kem_metrics]},
    Ports = [
        #{id => Name,
          start => {kem_port, start_link, [Name, I, dir_or_undefined(ShmDir), Env]},
          restart => permanent,
          shutdown => 5000,
          type => worker,
          modules => [kem_port]}
     || {I, {Name, Env}} <- lists:zip(lists:seq(1, length(Specs)), Specs)],
    Owners = [#{id => kem_shm_dir, start => {kem_shm_dir, start_link, [ShmDir]}},
              #{id => kem_quarantine, start => {kem_quarantine, start_link, []}},
              #{id => kem_dashboard_stats, start => {kem_dashboard_stats, start_link, []}}],
    Session = #{id => kem_session, start => {kem_session, start_link, []}, modules => [kem_session]},
    %% After the ports: at first start they open their own; the spare
    %% server then prepares spares for later restarts (kem_spare).
    %% Each group gets its own `spares' spares, opened with its environment
    %% (its adapter): only that group's ports take them.
    Spare = [#{id => kem_spare, start => {kem_spare, start_link, [dir_or_undefined(ShmDir), kem_place:group_envs()]},
               restart => permanent, shutdown => 5000, type => worker,
               modules => [kem_spare]} || Specs =/= []],
    %% Generous intensity: a kill or a runaway kernel restarts one port, and
    %% tests provoke several in a row; the app should not give up on that.
    %% The cluster's children last: a node serves others once its ports answer.
    {ok, {#{strategy => one_for_one, intensity => 50, period => 10},
          [Metrics | Owners ++ Ports] ++ [Session | Spare] ++ kem_cluster:children()}}.

dir_or_undefined({ok, Dir}) -> Dir;
dir_or_undefined({error, _}) -> undefined.

%% None on a front node (kem_cluster).
adapter_groups() ->
    case kem_cluster:local_gpus() of
        true -> kem_adapters:groups();
        false -> []
    end.

ports_per_group() ->
    case application:get_env(kem, ports, auto) of
        N when is_integer(N), N >= 1 -> N;
        auto -> auto;
        Other -> error({bad_config, {ports, Other}})
    end.
