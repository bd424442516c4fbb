%%% @doc kem's metrics in a HyperBEAM node's Prometheus registry, so the
%%% node's `/metrics' shows them: a prometheus.erl collector that renders
%%% `kem_metrics:families/0' at scrape time (one source of truth, the ETS
%%% table that survives port restarts; no double bookkeeping).
%%%
%%% No `-behaviour(prometheus_collector)' attribute: where prometheus is not
%%% on the compile path (kem's own CI) it is an undefined-behaviour warning
%%% and `warnings_as_errors' fails the build. The callbacks are the
%%% behaviour's all the same (collect_mf/2, deregister_cleanup/1), and
%%% `ensure_registered/0' registers the module explicitly once the registry
%%% exists (HyperBEAM starts prometheus with its HTTP server, usually after
%%% kem). Prometheus is never required: outside a node this is a no-op.
-module(kem_prometheus).
-export([ensure_registered/0, collect_mf/2, deregister_cleanup/1]).

-define(REGISTRY, default).

%% @doc Register with the `default' registry if prometheus runs and kem is
%% not registered yet. Idempotent; cheap enough for a periodic check.
-spec ensure_registered() -> registered | absent.
ensure_registered() ->
    case ets:info(prometheus_registry_table) =/= undefined
         andalso kem_optional:has(prometheus_registry, register_collector, 2) of
        true ->
            case lists:member(?MODULE, prometheus_registry:collectors(?REGISTRY)) of
                true -> registered;
                false ->
                    ok = prometheus_registry:register_collector(?REGISTRY, ?MODULE),
                    registered
            end;
        false ->
            absent
    end.

%% @doc Called by prometheus at scrape time, once per family.
-spec collect_mf(atom(), fun((term()) -> term())) -> ok.
collect_mf(_Registry, Callback) ->
    [Callback(prometheus_model_helpers:create_mf(Name, Help, Type, metrics(Type, Series)))
     || {Name, Type, Help, Series} <- kem_metrics:families(), Series =/= []],
    ok.

-spec deregister_cleanup(atom()) -> ok.
deregister_cleanup(_Registry) -> ok.

%% prometheus_model_helpers wants `{Labels, Value}' for counters and gauges
%% and `{Labels, CumulativeBuckets, Count, Sum}' with `infinity' last for
%% histograms: kem_metrics already keeps cumulative buckets.
metrics(histogram, Series) ->
    [{Labels, [{bound(Le), N} || {Le, N} <- Buckets], Count, Sum}
     || {Labels, Buckets, Count, Sum} <- Series];
metrics(_Type, Series) ->
    Series.

bound(inf) -> infinity;
bound(Le) -> Le.
