%%% @doc The modern kem API: results as `{ok, Binary}', failures as
%%% `{error, {Reason, Detail}}', never an exception.
%%%
%%% Every call goes through `call/3', the one place that picks a port
%%% (round robin over `kem_sup:port_names/0') and applies the timeout.
-module(kem).

-export([execute/3, adapter_info/0, stats/0, config/0, ping/0, metrics/0,
         call/3, call_usage/3, default_timeout/0]).
%% Sessions and chains (kem_session, docs/sessions.md).
-export([session_open/1, session_close/1, session_call/4, chain/2, buffer_create/3, buffer_write/4,
         buffer_read/2, buffer_read/3, buffer_list/1, buffer_free/2]).

-type kernel_id() :: binary().
-type opts() :: #{output_size_hint => pos_integer(),
                  output_size => non_neg_integer(),
                  params => binary(),
                  workgroups => {pos_integer(), pos_integer(), pos_integer()},
                  entry_point => binary() | atom(),
                  timeout => timeout(),
                  usage => boolean()}.
%% What one call cost, for metering: `us' is GPU time where the port
%% measured it (`clock => gpu'), else the caller's wall time (`clock => wall').
-type usage() :: #{kernel_id := binary() | undefined,
                   bytes_in := non_neg_integer(),
                   bytes_out := non_neg_integer(),
                   us := non_neg_integer(),
                   clock := gpu | wall}.
-export_type([kernel_id/0, opts/0, usage/0]).

%% @doc Run kernel KernelId on Input. Output size is `output_size', else
%% `byte_size(Input) * output_size_hint' (hint default 1). With
%% `usage => true' a success is `{ok, Result, Usage}'.
-spec execute(kernel_id(), binary(), opts()) ->
    {ok, binary()} | {ok, binary(), usage()} | {error, kem_port:reason()}.
execute(KernelId, Input, Opts) when is_binary(KernelId), is_binary(Input), is_map(Opts) ->
    {Timeout, PortOpts0} = take_timeout(Opts),
    {WantUsage, PortOpts} = case maps:take(usage, PortOpts0) of
        {W, Rest} -> {W =:= true, Rest};
        error -> {false, PortOpts0}
    end,
    case call_usage(execute, {KernelId, Input, PortOpts}, Timeout) of
        {{ok, Result}, Usage} when WantUsage -> {ok, Result, Usage};
        {Reply, _Usage} -> Reply
    end;
execute(_KernelId, _Input, _Opts) ->
    {error, {bad_args, <<"execute(KernelId :: binary(), Input :: binary(), Opts :: map())">>}}.

%% @doc The adapter in use and the limits kem enforces, as a JSON binary.
-spec adapter_info() -> {ok, binary()} | {error, kem_port:reason()}.
adapter_info() ->
    call(adapter_info, {}, default_timeout()).

%% @doc Counters of every port, one map per port name.
-spec stats() -> {ok, #{atom() => map()}} | {error, kem_port:reason()}.
stats() ->
    each_port(stats).

%% @doc The settings each port runs with (kernel dirs, gateways, tier...).
-spec config() -> {ok, map()} | {error, kem_port:reason()}.
config() ->
    call(config, {}, default_timeout()).

-spec ping() -> {ok, pong} | {error, kem_port:reason()}.
ping() ->
    call(ping, {}, default_timeout()).

%% @doc kem's counters and histograms in the Prometheus text format.
-spec metrics() -> binary().
metrics() ->
    kem_metrics:text().

%% @doc Send Method/Args to the next port in turn.
-spec call(atom(), tuple(), timeout()) -> {ok, term()} | {error, kem_port:reason()}.
call(Method, Args, Timeout) ->
    element(1, call_usage(Method, Args, Timeout)).

%% @doc `call/3', also returning what the call cost; every call is counted
%% in `kem_metrics' here, the one road all calls take.
-spec call_usage(atom(), tuple(), timeout()) ->
    {{ok, term()} | {error, kem_port:reason()}, usage()}.
call_usage(Method, Args, Timeout) ->
    Start = erlang:monotonic_time(microsecond),
    Reply = case next_port() of
        {ok, Port} -> kem_shm:call(Port, Method, Args, Timeout);
        Error -> Error
    end,
    WallUs = erlang:monotonic_time(microsecond) - Start,
    {KernelId, BytesIn} = kernel_and_input(Args),
    BytesOut = case Reply of {ok, Bin} when is_binary(Bin) -> byte_size(Bin); _ -> 0 end,
    ok = kem_metrics:call_done(Method, Reply, WallUs, {BytesIn, BytesOut}),
    {Reply, #{kernel_id => KernelId, bytes_in => BytesIn, bytes_out => BytesOut,
              us => WallUs, clock => wall}}.

%% @doc Sessions and chains: kem_session has the full description.
-spec session_open(map()) -> {ok, kem_session:session()} | {error, kem_port:reason()}.
session_open(Opts) -> kem_session:open(Opts).
-spec session_close(kem_session:session()) -> ok | {error, kem_port:reason()}.
session_close(Session) -> kem_session:close(Session).
-spec session_call(kem_session:session(), kernel_id(), binary(), map()) -> {ok, binary()} | {error, kem_port:reason()}.
session_call(Session, KernelId, Input, Opts) -> kem_session:call(Session, KernelId, Input, Opts).
-spec chain([kem_session:step()], map()) -> {ok, binary() | #{binary() => binary()}} | {error, kem_port:reason()}.
chain(Steps, Opts) -> kem_session:chain(Steps, Opts).
-spec buffer_create(kem_session:session(), kem_session:name(), pos_integer() | binary()) -> ok | {error, kem_port:reason()}.
buffer_create(Session, Name, SizeOrBytes) -> kem_session:buffer_create(Session, Name, SizeOrBytes).
-spec buffer_write(kem_session:session(), kem_session:name(), non_neg_integer(), binary()) -> ok | {error, kem_port:reason()}.
buffer_write(Session, Name, Offset, Bytes) -> kem_session:buffer_write(Session, Name, Offset, Bytes).
-spec buffer_read(kem_session:session(), kem_session:name()) -> {ok, binary()} | {error, kem_port:reason()}.
buffer_read(Session, Name) -> kem_session:buffer_read(Session, Name).
-spec buffer_read(kem_session:session(), kem_session:name(), {non_neg_integer(), non_neg_integer()}) ->
    {ok, binary()} | {error, kem_port:reason()}.
buffer_read(Session, Name, Range) -> kem_session:buffer_read(Session, Name, Range).
-spec buffer_list(kem_session:session()) -> {ok, #{binary() => non_neg_integer()}} | {error, kem_port:reason()}.
buffer_list(Session) -> kem_session:buffer_list(Session).
-spec buffer_free(kem_session:session(), kem_session:name()) -> ok | {error, kem_port:reason()}.
buffer_free(Session, Name) -> kem_session:buffer_free(Session, Name).

%%% internals

kernel_and_input(Args) when tuple_size(Args) >= 2,
                            is_binary(element(1, Args)), is_binary(element(2, Args)) ->
    {element(1, Args), byte_size(element(2, Args))};
kernel_and_input(_) ->
    {undefined, 0}.

take_timeout(Opts) ->
    case maps:take(timeout, Opts) of
        {T, Rest} -> {T, Rest};
        error -> {default_timeout(), Opts}
    end.

%% @doc The one default timeout of a call (app env `timeout', ms).
-spec default_timeout() -> timeout().
default_timeout() ->
    application:get_env(kem, timeout, 30000).

next_port() ->
    case persistent_term:get({kem, ports}, undefined) of
        undefined ->
            {error, {not_started, <<"application kem is not running">>}};
        {Names, Counter} ->
            N = atomics:add_get(Counter, 1, 1),
            {ok, element(1 + (N rem tuple_size(Names)), Names)}
    end.

each_port(Method) ->
    case persistent_term:get({kem, ports}, undefined) of
        undefined ->
            {error, {not_started, <<"application kem is not running">>}};
        {Names, _} ->
            Results = [{Name, kem_port:call(Name, Method, {}, default_timeout())}
                       || Name <- tuple_to_list(Names)],
            case [E || {_, {error, _} = E} <- Results] of
                [] -> {ok, maps:from_list([{Name, V} || {Name, {ok, V}} <- Results])};
                [Error | _] -> Error
            end
    end.
