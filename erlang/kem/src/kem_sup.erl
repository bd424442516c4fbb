%%% @doc Supervises the port owners: one `kem_port' per configured port.
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
    [port_name(I) || I <- lists:seq(1, port_count())].

init([]) ->
    %% The shared-memory directory is made here and handed to its owner and
    %% to every port owner: no port owner looks it up (kem_shm_dir).
    ShmDir = kem_shm_dir:create(),
    Count = port_count(),
    Counter = atomics:new(1, [{signed, false}]),
    persistent_term:put({kem, ports}, {list_to_tuple(port_names()), Counter}),
    %% One flag per port, set while it restarts: `kem' sends calls elsewhere.
    persistent_term:put({kem, restarting}, atomics:new(Count, [{signed, false}])),
    %% First, so its table outlives every port restart.
    Metrics = #{id => kem_metrics, start => {kem_metrics, start_link, []},
                restart => permanent, shutdown => 5000, type => worker,
                modules => [kem_metrics]},
    Ports = [
        #{id => port_name(I),
          start => {kem_port, start_link, [port_name(I), I, dir_or_undefined(ShmDir)]},
          restart => permanent,
          shutdown => 5000,
          type => worker,
          modules => [kem_port]}
     || I <- lists:seq(1, Count)],
    Owners = [#{id => kem_shm_dir, start => {kem_shm_dir, start_link, [ShmDir]}},
              #{id => kem_quarantine, start => {kem_quarantine, start_link, []}}],
    Session = #{id => kem_session, start => {kem_session, start_link, []}, modules => [kem_session]},
    %% After the ports: at first start they open their own; the spare
    %% server then prepares spares for later restarts (kem_spare).
    Spare = #{id => kem_spare, start => {kem_spare, start_link, [dir_or_undefined(ShmDir)]},
              restart => permanent, shutdown => 5000, type => worker,
              modules => [kem_spare]},
    %% Generous intensity: a kill or a runaway kernel restarts one port, and
    %% tests provoke several in a row; the app should not give up on that.
    {ok, {#{strategy => one_for_one, intensity => 50, period => 10}, [Metrics | Owners ++ Ports] ++ [Session, Spare]}}.

dir_or_undefined({ok, Dir}) -> Dir;
dir_or_undefined({error, _}) -> undefined.

port_count() ->
    case application:get_env(kem, ports, 1) of
        N when is_integer(N), N >= 1 -> N;
        Other -> error({bad_config, {ports, Other}})
    end.

port_name(I) ->
    list_to_atom("kem_port_" ++ integer_to_list(I)).
