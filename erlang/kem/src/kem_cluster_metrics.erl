%%% @doc Port groups (kem_place) and forwarded calls per remote node
%%% (kem_cluster_stats) as Prometheus families, appended to
%%% `kem_metrics:families/0' so `kem:metrics/0' and a node's `/metrics'
%%% show them.
-module(kem_cluster_metrics).
-export([families/0]).

-spec families() -> [kem_metrics:family()].
families() ->
    group_families(kem_place:groups()) ++ node_families(kem_cluster:stats()).

group_families(Groups) ->
    Labels = fun(G) -> [{<<"group">>, integer_to_binary(maps:get(group, G))},
                        {<<"adapter">>, adapter(maps:get(adapter, G))}] end,
    Family = fun(Name, Type, Help, Value) ->
                     {Name, Type, Help, [{Labels(G), Value(G)} || G <- Groups]}
             end,
    [Family(<<"kem_group_calls_total">>, counter, <<"Local calls run by a port group (one per adapter)">>,
            fun(G) -> maps:get(calls, G) end),
     Family(<<"kem_group_errors_total">>, counter, <<"Local calls of a port group that failed">>,
            fun(G) -> maps:get(errors, G) end),
     Family(<<"kem_group_pending">>, gauge, <<"Calls in flight on a port group now">>,
            fun(G) -> maps:get(pending, G) end),
     Family(<<"kem_group_latency_seconds_total">>, counter, <<"Summed wall time of a port group's calls">>,
            fun(G) -> maps:get(latency_us, G) / 1.0e6 end),
     Family(<<"kem_group_live_ports">>, gauge, <<"Ports of a group that are up">>,
            fun(G) -> maps:get(live, G) end)].

node_families(Stats) ->
    Series = fun(Key) -> [{[{<<"node">>, atom_to_binary(N, utf8)}], maps:get(Key, S)} || {N, S} <- maps:to_list(Stats)] end,
    [{<<"kem_remote_calls_total">>, counter, <<"Calls forwarded to another kem node">>, Series(calls)},
     {<<"kem_remote_errors_total">>, counter, <<"Forwarded calls the remote node answered with an error">>, Series(errors)},
     {<<"kem_remote_gone_total">>, counter, <<"Forwarded calls whose node went away before answering">>, Series(gone)},
     {<<"kem_remote_retries_total">>, counter, <<"Forwarded calls moved off a node to another">>, Series(retries)},
     {<<"kem_remote_pending">>, gauge, <<"Calls in flight on a remote node now">>, Series(pending)},
     {<<"kem_remote_latency_seconds_total">>, counter, <<"Summed wall time of forwarded calls">>,
      [{L, V / 1.0e6} || {L, V} <- Series(latency_us)]}].

adapter(default) -> <<"default">>;
adapter(I) -> integer_to_binary(I).
