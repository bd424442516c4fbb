%%% @doc dev_kem through HyperBEAM's own modules, for an operator to run
%%% inside a node's tree: `hb_ao:resolve' with kem registered, field reads
%%% without re-dispatch, and kem's collector in the Prometheus registry.
%%% Each test is skipped (reported as such) where HyperBEAM or prometheus
%%% is not on the code path, as in kem's own CI.
%%%
%%% In a node: compile this module onto the node's code path and run
%%% `eunit:test(kem_hyperbeam_tests, [verbose])' with kem started.
-module(kem_hyperbeam_tests).
-include_lib("eunit/include/eunit.hrl").

-define(KEM, #{<<"name">> => <<"kem@1.0">>, <<"module">> => dev_kem}).

hyperbeam_test_() ->
    case kem_optional:has(hb_ao, resolve, 3) of
        false ->
            {"HyperBEAM is not on the code path: skipped", []};
        true ->
            {setup, fun start/0, fun stop/1,
             [{timeout, 60, fun resolve_runs_a_kernel/0},
              {timeout, 60, fun resolve_errors_keep_their_reason/0},
              {timeout, 60, fun opts_without_kem_do_not_matter_to_field_reads/0}]}
    end.

prometheus_test_() ->
    case kem_optional:has(prometheus_text_format, format, 1) of
        false ->
            {"prometheus is not on the code path: skipped", []};
        true ->
            {setup, fun start_with_prometheus/0, fun stop/1,
             [{timeout, 60, fun metrics_reach_the_registry/0}]}
    end.

start() ->
    {ok, Apps} = application:ensure_all_started(kem),
    Apps.

start_with_prometheus() ->
    {ok, Prom} = application:ensure_all_started(prometheus),
    Prom ++ start().

stop(Apps) ->
    [application:stop(A) || A <- lists:reverse(Apps)],
    ok.

opts() ->
    #{preloaded_devices => hb_opts:get(preloaded_devices) ++ [?KEM]}.

resolve_runs_a_kernel() ->
    Input = crypto:strong_rand_bytes(4 * (1 + rand:uniform(300))),
    Req = #{<<"path">> => <<"execute_kernel">>,
            <<"content-type">> => <<"application/octet-stream">>,
            <<"kernel-id">> => <<"double">>, <<"body">> => Input},
    {ok, Reply} = hb_ao:resolve(#{<<"device">> => <<"kem@1.0">>}, Req, opts()),
    ?assertEqual(kem_ref:double_ref(Input, byte_size(Input)), hb_maps:get(<<"body">>, Reply, none, #{})),
    ?assertEqual(200, hb_maps:get(<<"status">>, Reply, none, #{})).

resolve_errors_keep_their_reason() ->
    Req = #{<<"path">> => <<"execute_kernel">>,
            <<"body">> => kem_json:encode(#{<<"kernel-id">> => <<"nope">>, <<"input-data">> => [1]})},
    {error, Reply} = hb_ao:resolve(#{<<"device">> => <<"kem@1.0">>}, Req, opts()),
    ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"kernel_not_found">>}, Reply).

%% The issue's trap: hb_ao:get on a message whose device is kem@1.0 loads
%% kem again per field and throws device_not_loadable with Opts that do not
%% list kem. hb_maps:get never dispatches.
opts_without_kem_do_not_matter_to_field_reads() ->
    Msg = #{<<"device">> => <<"kem@1.0">>, <<"kernel-id">> => <<"double">>,
            <<"input-data">> => <<1, 3, 5, 7>>},
    ?assertMatch({ok, #{<<"body">> := <<2, 6, 10, 14>>}}, dev_kem:execute_kernel(Msg, Msg, #{})).

metrics_reach_the_registry() ->
    {ok, _} = kem:execute(<<"double">>, <<1, 2, 3, 4>>, #{}),
    registered = kem_prometheus:ensure_registered(),
    Text = prometheus_text_format:format(default),
    ?assertNotEqual(nomatch, binary:match(Text, <<"kem_calls_total{method=\"execute\"}">>)),
    ?assertNotEqual(nomatch, binary:match(Text, <<"kem_call_duration_seconds_count{method=\"execute\"}">>)).
