%%% @doc The modern kem API: results as `{ok, Binary}', failures as
%%% `{error, {Reason, Detail}}', never an exception, whatever the terms.
%%%
%%% Every call goes through `call_usage/3', the one place that checks
%%% arguments (kem_args), refuses quarantined kernels (kem_quarantine),
%%% picks a port (`kem_place': adapter groups, kernel affinity) or forwards
%%% to another node (`kem_cluster', on a node without local GPUs), applies
%%% the timeout and counts the call (kem_metrics). Session calls and chains go
%%% to kem_session instead, through the same checks, quarantine and count
%%% in their functions here.
-module(kem).

-export([execute/3, run/3, request/2, request_usage/2, adapter_info/0, stats/0, config/0, ping/0,
         health/0, metrics/0, call/3, call_usage/3, call_local/3, adapters/0, default_timeout/0, dashboard/0, dashboard_data/0]).
%% Sessions and chains (kem_session, docs/sessions.md).
-export([session_open/1, session_close/1, session_call/4, chain/2, request_chain_usage/2, buffer_create/3, buffer_write/4,
         buffer_read/2, buffer_read/3, buffer_list/1, buffer_free/2]).

-type kernel_id() :: binary().
-type opts() :: #{output_size_hint => pos_integer(),
                  output_size => non_neg_integer(),
                  params => binary(),
                  workgroups => {pos_integer(), pos_integer(), pos_integer()},
                  grid => {pos_integer(), pos_integer(), pos_integer()},
                  constants => #{atom() | binary() => number()},
                  entry_point => binary() | atom(),
                  timeout => timeout(),
                  max_output_bytes => non_neg_integer(),
                  usage => boolean(),
                  debug => boolean()}.
%% What one call cost, for metering: `us' is GPU time where the port
%% measured it (`clock => gpu'), else the caller's wall time (`clock => wall');
%% `node' is the node whose GPU ran it (another one when forwarded, kem_cluster);
%% `gas' what the kernel did (docs/metering.md), where the caller asked for usage.
-type usage() :: #{kernel_id := binary() | undefined,
                   bytes_in := non_neg_integer(),
                   bytes_out := non_neg_integer(),
                   us := non_neg_integer(),
                   clock := gpu | wall,
                   node => node(),
                   gas => non_neg_integer()}.
-export_type([kernel_id/0, opts/0, usage/0]).

-define(KERNEL_METHODS, [execute_kernel, execute_kernel_with_params, execute, run]).

%% @doc Run kernel KernelId on Input. Output size is `output_size', else
%% `byte_size(Input) * output_size_hint' (hint default 1). `workgroups'
%% `{X, Y, Z}' sets the dispatch, or `grid' `{X, Y, Z}' invocations, which
%% the port divides by the kernel's workgroup size rounding up (not both;
%% docs/dispatch.md). `constants' `#{Name => Number}' set the kernel's
%% `override' declarations (docs/kernels.md). `timeout' (ms,
%% 1..3600000 or infinity) defaults to the app env `timeout';
%% `max_output_bytes' refuses a larger output with `too_large' before
%% anything runs; with `usage => true' a success is `{ok, Result, Usage}';
%% with `debug => true' it is `{ok, Result, #{debug => #{records := [u32],
%% dropped := N, capacity := C}}}', the records the kernel wrote to its
%% debug channel (docs/debug.md). Any other option is refused with `bad_args'.
-spec execute(term(), term(), term()) ->
    {ok, binary()} | {ok, binary(), usage() | #{debug := map()}} | {error, kem_port:reason()}.
execute(KernelId, Input, Opts) when is_binary(KernelId), is_binary(Input), is_map(Opts) ->
    case kem_args:execute_opts(Opts) of
        {ok, Timeout, Budget, WantUsage, PortOpts} ->
            T = case Timeout of default -> default_timeout(); _ -> Timeout end,
            case budgeted(execute, {KernelId, Input, PortOpts}, Budget, T, WantUsage) of
                {{ok, {Result, Debug}}, _Usage} when is_map(Debug) -> {ok, Result, #{debug => Debug}};
                {{ok, Result}, Usage} when WantUsage -> {ok, Result, Usage};
                {Reply, _Usage} -> Reply
            end;
        Error ->
            Error
    end;
execute(_KernelId, _Input, _Opts) ->
    {error, {bad_args, <<"execute(KernelId :: binary(), Input :: binary(), Opts :: map())">>}}.

%% @doc A kernel called by named buffers: `{ok, #{Name => Bytes}}' (kem_run).
-spec run(term(), term(), term()) -> {ok, #{binary() => binary()}} | {error, kem_port:reason()}.
run(KernelId, Buffers, Opts) -> kem_run:run(KernelId, Buffers, Opts).

%% @doc A request from outside the node (dev_kem): Method is
%% `execute_kernel' or `execute_kernel_with_params' with their Args, or
%% `execute' with `{KernelId, Input, Opts}' (dev_kem's grid, workgroups
%% and constants: kem:execute/3's port options, checked as its are); the
%% output may be at most `request_max_output_bytes' (app env, default
%% 16 MiB, below the port's own cap), the timeout is the default.
-spec request(term(), term()) -> {ok, binary()} | {error, kem_port:reason()}.
request(Method, Args) ->
    element(1, request_usage(Method, Args)).

%% @doc `request/2', also returning what the call cost (for metering).
-spec request_usage(term(), term()) -> {{ok, binary()} | {error, kem_port:reason()}, usage()}.
request_usage(Method, Args) when Method =:= execute_kernel; Method =:= execute_kernel_with_params;
                                 Method =:= execute ->
    budgeted(Method, Args, request_budget(), default_timeout(), true);
request_usage(_Method, _Args) ->
    {{error, {bad_args, <<"request(execute_kernel | execute_kernel_with_params | execute, Args)">>}}, no_usage()}.

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

%% @doc Liveness only: a port process answers. It says nothing about the
%% adapter (`pong' even when every kernel call fails with `no_adapter');
%% `health/0' does.
-spec ping() -> {ok, pong} | {error, kem_port:reason()}.
ping() ->
    call(ping, {}, default_timeout()).

%% @doc kem's counters and histograms, Prometheus text format 0.0.4.
-spec metrics() -> {ok, binary()}.
metrics() ->
    {ok, kem_metrics:text()}.

%% @doc The operators' page, HTML with the figures of now inside, and the figures it polls (kem_dashboard).
-spec dashboard() -> {ok, binary()} | {error, {not_found, binary()}}.
dashboard() -> kem_dashboard:page().
-spec dashboard_data() -> {ok, map()}.
dashboard_data() -> {ok, kem_dashboard:data()}.

%% @doc Whether each port can run kernels, on which adapter, CPU or GPU,
%% and why not (kem_health).
-spec health() -> {ok, #{atom() => kem_health:port_health()}} | {error, kem_port:reason()}.
health() ->
    kem_health:report().

%% @doc Send Method/Args to the port `kem_place' picks, or, on a node
%% without local GPUs (or with all its ports down), to another kem node.
-spec call(term(), term(), term()) -> {ok, term()} | {error, kem_port:reason()}.
call(Method, Args, Timeout) ->
    element(1, call_checked(Method, Args, Timeout, false)).

%% @doc `call/3', also returning what the call cost; every call that passes
%% the argument checks is counted in `kem_metrics' here, the one road all
%% calls take.
-spec call_usage(term(), term(), term()) ->
    {{ok, term()} | {error, kem_port:reason()}, usage()}.
call_usage(Method, Args, Timeout) ->
    call_checked(Method, Args, Timeout, true).

%% Gas: whether the port is asked for the call's gas (kem_usage:ask_gas/2).
call_checked(Method, Args, Timeout, Gas) ->
    case kem_args:call(Method, Args, Timeout) of
        ok -> checked_call(Method, Args, Timeout, Gas);
        Error -> {Error, no_usage()}
    end.

%% @doc The timeout of a call that names none: the app env `timeout' (ms),
%% read here and nowhere else.
-spec default_timeout() -> timeout().
default_timeout() ->
    Configured = application:get_env(kem, timeout, 30000),
    case kem_args:timeout(Configured) of
        ok -> Configured;
        _ -> 30000
    end.

%% @doc Sessions and chains: kem_session has the full description. They
%% reach a port without `call_usage/3', so the same guards are applied
%% here: bytes over the port's input limit, a bad timeout and a
%% quarantined kernel are refused before a frame is made; a session call
%% that outlives the default timeout quarantines its kernel.
-spec session_open(map()) -> {ok, kem_session:session()} | {error, kem_port:reason()}.
session_open(Opts) -> guarded([fun() -> opt_timeout(Opts) end], fun() -> kem_session:open(Opts) end).
-spec session_close(kem_session:session()) -> ok | {error, kem_port:reason()}.
session_close(Session) -> kem_session:close(Session).
-spec session_call(kem_session:session(), kernel_id(), binary(), map()) -> {ok, binary() | #{binary() => binary()}} | {error, kem_port:reason()}.
session_call(Session, KernelId, Input, Opts) ->
    guarded([fun() -> opt_timeout(Opts) end, fun() -> kem_args:payload(Input) end,
             fun() -> quarantine_check(kernel_id(KernelId)) end],
            fun() ->
                Timeout = case is_map(Opts) of true -> maps:get(timeout, Opts, default_timeout()); false -> none end,
                Run = fun() -> kem_session:call(Session, KernelId, Input, Opts) end,
                Reply = element(1, counted(session_call, usage_kernel(KernelId), Input, Run)),
                kem_quarantine:on_timeout(kernel_id(KernelId), Timeout, default_timeout(), Reply)
            end).
%% A chain that outlived the default timeout on the GPU counts against its
%% kernels (kem_timeout:kernel_was_stuck/1), for chains only (`{chain,
%% Kernel}'): its steps share one timeout, so which one ran away is
%% unknown, and how much work it asks is the requester's choice (up to 16
%% times the port's largest output, 256 times a 16 MiB dev_kem call), so
%% even a chain of one kernel proves nothing of that kernel's calls: a
%% stranger's 1.2 KB chain of `double' alone ran 19 times its largest call
%% and had `double' refused to every caller (kem_red_team2_tests).
-spec chain([kem_session:step()], map()) -> {ok, binary() | #{binary() => binary()}} | {error, kem_port:reason()}.
chain(Steps, Opts) ->
    element(1, chain_checked(Steps, Opts)).

%% @doc A stateless chain from outside the node (dev_kem's execute_chain),
%% also returning what it cost: as `chain/2', with `request/2''s output
%% budget on the chain's input and on all the buffers its steps make
%% together, and each step's `workgroups' bounded by its output
%% (kem_chain_budget). The port is asked for the chain's gas (`usage =>
%% true'), which the usage record carries (docs/metering.md).
-spec request_chain_usage([kem_session:step()], map()) ->
    {{ok, binary() | #{binary() => binary()}} | {error, kem_port:reason()}, usage()}.
request_chain_usage(Steps, Opts) when is_list(Steps), is_map(Opts) ->
    Budget = request_budget(),
    Input = maps:get(input, Opts, <<>>),
    case is_binary(Input) andalso byte_size(Input) > Budget of
        true -> {{error, {too_large, over_budget(byte_size(Input), Budget)}}, no_usage()};
        false ->
            case kem_chain_budget:check(proper(Steps), Input, Budget) of
                %% The port counts the planned chain against the same budget exactly
                %% (max_bytes, docs/sessions.md): kem_chain_budget cannot see a
                %% kernel's shape, nor its dispatch's invocations.
                ok -> chain_checked(Steps, (maps:without([session], Opts))#{usage => true, max_bytes => Budget});
                Refused -> {Refused, no_usage()}
            end
    end;
request_chain_usage(_Steps, _Opts) ->
    {{error, {bad_args, <<"request_chain_usage(Steps :: [map()], Opts :: map())">>}}, no_usage()}.

-spec buffer_create(kem_session:session(), kem_session:name(), pos_integer() | binary()) -> ok | {error, kem_port:reason()}.
buffer_create(Session, Name, SizeOrBytes) ->
    guarded([fun() -> kem_args:payload(SizeOrBytes) end],
            fun() -> kem_session:buffer_create(Session, Name, SizeOrBytes) end).
-spec buffer_write(kem_session:session(), kem_session:name(), non_neg_integer(), binary()) -> ok | {error, kem_port:reason()}.
buffer_write(Session, Name, Offset, Bytes) ->
    guarded([fun() -> kem_args:payload(Bytes) end],
            fun() -> kem_session:buffer_write(Session, Name, Offset, Bytes) end).
-spec buffer_read(kem_session:session(), kem_session:name()) -> {ok, binary()} | {error, kem_port:reason()}.
buffer_read(Session, Name) -> kem_session:buffer_read(Session, Name).
-spec buffer_read(kem_session:session(), kem_session:name(), {non_neg_integer(), non_neg_integer()}) ->
    {ok, binary()} | {error, kem_port:reason()}.
buffer_read(Session, Name, Range) -> kem_session:buffer_read(Session, Name, Range).
-spec buffer_list(kem_session:session()) -> {ok, #{binary() => non_neg_integer()}} | {error, kem_port:reason()}.
buffer_list(Session) -> kem_session:buffer_list(Session).
-spec buffer_free(kem_session:session(), kem_session:name()) -> ok | {error, kem_port:reason()}.
buffer_free(Session, Name) -> kem_session:buffer_free(Session, Name).

%% @doc This node's port groups, one per adapter, with their state
%% (`up', `degraded', `down') and counters (kem_place).
-spec adapters() -> [map()].
adapters() ->
    kem_place:groups().

%%% internals

budgeted(Method, Args, Budget, Timeout, Gas) ->
    case kem_args:call(Method, Args, Timeout) of
        ok ->
            {_, Input, Third} = Args,
            Size = kem_args:output_size(Method, Input, Third),
            case Budget =:= infinity orelse Size =< Budget of
                true -> checked_call(Method, Args, Timeout, Gas);
                false -> {{error, {too_large, over_budget(Size, Budget)}}, no_usage()}
            end;
        Error ->
            {Error, no_usage()}
    end.

over_budget(Size, Budget) ->
    iolist_to_binary(io_lib:format("an output of ~b bytes is over this request's limit of ~b", [Size, Budget])).

request_budget() ->
    case application:get_env(kem, request_max_output_bytes, 16 bsl 20) of
        N when is_integer(N), N >= 0 -> N;
        _ -> 16 bsl 20
    end.

%% Arguments checked: quarantine, a port, the call, its cost. With Gas the
%% port is asked for the call's gas, which joins the usage record; the
%% caller and kem_metrics (by the caller's Method) see the reply without it.
checked_call(Method, Args, Timeout, Gas) ->
    {PortMethod, PortArgs} = case Gas of true -> kem_usage:ask_gas(Method, Args); false -> {Method, Args} end,
    Start = erlang:monotonic_time(microsecond),
    {Answer, Node} = case kem_cluster:local_gpus() of
        true -> local_or_fallback(PortMethod, PortArgs, Timeout);
        false -> kem_cluster:forward(PortMethod, PortArgs, Timeout)
    end,
    WallUs = erlang:monotonic_time(microsecond) - Start,
    {Reply, GasUsed} = kem_usage:take_gas(Answer),
    {Reply, done(Method, kem_usage:with_gas(kem_usage:of_call(Args, Reply, WallUs, Node), GasUsed), Reply)}.

%% @doc Run Method/Args on this node's ports only (a call forwarded here:
%% its arguments were checked where it was made).
-spec call_local(atom(), tuple(), timeout()) -> {ok, term()} | {error, kem_port:reason()}.
call_local(Method, Args, Timeout) ->
    port_call(Method, Args, Timeout).

%% With every local port down (restarting), another node may take the call.
local_or_fallback(Method, Args, Timeout) ->
    case call_local(Method, Args, Timeout) of
        {error, {port_unavailable, _}} = Down -> kem_cluster:fallback(Method, Args, Timeout, Down);
        Reply -> {Reply, node()}
    end.

port_call(Method, Args, Timeout) ->
    Kernel = kernel_of(Method, Args),
    case quarantine_check(Kernel) of
        ok ->
            {KernelId, _} = kem_usage:kernel_and_input(Args),
            case kem_place:pick(KernelId) of
                {ok, I, Port} ->
                    Start = erlang:monotonic_time(microsecond),
                    Reply = kem_quarantine:on_timeout(Kernel, Timeout, default_timeout(), kem_shm:call(Port, Method, Args, Timeout)),
                    ok = kem_place:done(I, Reply, erlang:monotonic_time(microsecond) - Start),
                    Reply;
                Error ->
                    Error
            end;
        Refused ->
            Refused
    end.

chain_checked(Steps, Opts) ->
    Kernels = lists:usort([K || #{kernel := K} <- proper(Steps), is_binary(K)]),
    Checks = [fun() -> opt_timeout(Opts) end,
              fun() -> case is_map(Opts) of true -> kem_args:payload(maps:get(input, Opts, <<>>)); false -> ok end end
              | [fun() -> quarantine_check(Key) end || K <- Kernels, Key <- [K, {chain, K}]]],
    case guarded(Checks, fun() -> ok end) of
        ok ->
            Input = case is_map(Opts) of true -> maps:get(input, Opts, <<>>); false -> <<>> end,
            Timeout = case is_map(Opts) of true -> maps:get(timeout, Opts, default_timeout()); false -> none end,
            {Reply, Usage} = counted(chain, chain_kernels(Steps), Input, fun() -> kem_session:chain(Steps, Opts) end),
            {kem_quarantine:on_timeout(chain_quarantine(Kernels), Timeout, default_timeout(), Reply), Usage};
        Error ->
            {Error, no_usage()}
    end.

%% Who a chain's timeout counts against: each of its kernels, in chains.
chain_quarantine(Kernels) -> [{chain, K} || K <- Kernels].

%% What ran, for usage records: the steps' kernel ids, comma-separated.
chain_kernels(Steps) ->
    iolist_to_binary(lists:join(<<",">>, [K || #{kernel := K} <- proper(Steps), is_binary(K)])).

%% The elements of a proper list, else none (kem_session refuses the rest).
proper(List) ->
    try length(List) of _ -> List
    catch error:badarg -> []
    end.

%% Run a session call or a chain that has passed its checks, count it in
%% kem_metrics (by method) as checked_call/3 counts a call, and say what it
%% cost (on this node: sessions are not forwarded).
counted(Method, KernelId, Input, Run) ->
    Start = erlang:monotonic_time(microsecond),
    {Reply, Gas} = kem_usage:take_gas(Run()),
    WallUs = erlang:monotonic_time(microsecond) - Start,
    BytesIn = case is_binary(Input) of true -> byte_size(Input); false -> 0 end,
    {Reply, done(Method, kem_usage:with_gas(kem_usage:of_input(KernelId, BytesIn, Reply, WallUs, node()), Gas), Reply)}.

%% Count a call that ran in kem_metrics (by method) and the dashboard; its usage record.
done(Method, Usage = #{kernel_id := KernelId, bytes_in := In, bytes_out := Out, us := WallUs}, Reply) ->
    ok = kem_metrics:call_done(Method, Reply, WallUs, {In, Out}),
    ok = kem_dashboard_stats:call_done(KernelId, Reply, WallUs),
    Usage.

%% Run Fun once every check is ok; else the first check's error.
guarded([], Fun) -> Fun();
guarded([Check | Rest], Fun) ->
    case Check() of
        ok -> guarded(Rest, Fun);
        Error -> Error
    end.

opt_timeout(#{timeout := Timeout}) -> kem_args:timeout(Timeout);
opt_timeout(_) -> ok.

kernel_id(Id) when is_binary(Id) -> Id;
kernel_id(_) -> none.

usage_kernel(Id) when is_binary(Id) -> Id;
usage_kernel(_) -> undefined.

no_usage() -> kem_usage:none().

kernel_of(Method, Args) ->
    case lists:member(Method, ?KERNEL_METHODS) of
        true -> element(1, Args);
        false -> none
    end.

quarantine_check(none) -> ok;
quarantine_check(Kernel) -> kem_quarantine:check(Kernel).

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
