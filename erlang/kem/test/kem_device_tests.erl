%%% @doc `dev_kem' as a HyperBEAM node and its operator see it, against the
%%% real port: kebab-case keys, binary bodies, JSON errors with their
%%% reasons and no node paths, the original's adapter_info types, usage
%%% records, and the metrics that survive a port restart.
-module(kem_device_tests).
-include_lib("eunit/include/eunit.hrl").

-define(DOUBLE, <<"double">>).

device_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 60, fun every_app_env_key_reaches_the_port/0},
      {timeout, 60, fun kebab_case_keys/0},
      {timeout, 60, fun binary_body_with_keys/0},
      {timeout, 60, fun errors_are_json_with_reasons_and_no_paths/0},
      {timeout, 60, fun encoded_image_files_are_refused/0},
      {timeout, 60, fun adapter_info_has_the_original_types/0},
      {timeout, 60, fun usage_is_reported/0},
      {timeout, 120, fun metrics_count_and_survive_a_port_restart/0}]}.

%% A port setting with no Erlang code of its own: KEM_MAX_BATCH.
start() -> kem_test_app:start([{max_batch, 7}]).

stop(Apps) -> kem_test_app:stop(Apps).

double_ref(Input, OutputSize) -> kem_ref:double_ref(Input, OutputSize).

body_details(#{<<"body">> := Body}) ->
    {ok, #{<<"details">> := Details}} = kem_json:decode(Body),
    Details.

every_app_env_key_reaches_the_port() ->
    ?assertMatch({ok, #{max_batch := 7}}, kem:config()).

kebab_case_keys() ->
    [begin
         Input = crypto:strong_rand_bytes(Size),
         Want = double_ref(Input, Size * Hint),
         Json = kem_json:encode(#{<<"kernel-id">> => ?DOUBLE,
                                  <<"input-data">> => binary_to_list(Input),
                                  <<"output-size-hint">> => Hint}),
         ?assertMatch({ok, #{<<"status">> := 200, <<"body">> := Want}},
                      dev_kem:execute_kernel(#{}, #{<<"body">> => Json}, #{})),
         %% As message keys (HTTP headers arrive as binaries).
         Keys = #{<<"kernel-id">> => ?DOUBLE, <<"input-data">> => Input,
                  <<"output-size-hint">> => integer_to_binary(Hint)},
         ?assertMatch({ok, #{<<"status">> := 200, <<"body">> := Want}},
                      dev_kem:execute_kernel(#{}, Keys, #{}))
     end || Size <- [4, 37, 1000], Hint <- [1, 3]].

binary_body_with_keys() ->
    [begin
         Input = crypto:strong_rand_bytes(Size),
         Req = #{<<"content-type">> => <<"application/octet-stream">>, <<"body">> => Input,
                 <<"kernel-id">> => ?DOUBLE, <<"output-size-hint">> => <<"2">>},
         Want = double_ref(Input, 2 * Size),
         ?assertMatch({ok, #{<<"status">> := 200, <<"body">> := Want}},
                      dev_kem:execute_kernel(Req, Req#{<<"path">> => <<"execute_kernel">>}, #{}))
     end || Size <- [1, 4, 4097, 1 bsl 20]],
    %% An image as bytes, params as a header value.
    {W, H} = {20, 10},
    Image = binary:copy(<<9, 99, 199, 255>>, W * H),
    Req = #{<<"content-type">> => <<"application/octet-stream">>, <<"body">> => Image,
            <<"kernel-id">> => <<"pixelize">>, <<"params">> => <<"20, 10, 4, 0">>},
    ?assertMatch({ok, #{<<"status">> := 200, <<"body">> := Image}},
                 dev_kem:execute_kernel_with_params(#{}, Req, #{})),
    %% Binary body, no kernel id: a 400 that says which field.
    {error, #{<<"status">> := 400} = NoId} = dev_kem:execute_kernel(#{}, maps:remove(<<"kernel-id">>, Req), #{}),
    Missing = body_details(NoId),
    ?assertNotEqual(nomatch, binary:match(Missing, <<"kernel-id">>)).

errors_are_json_with_reasons_and_no_paths() ->
    {error, Reply} = dev_kem:execute_kernel(
        #{}, #{<<"body">> => kem_json:encode(#{<<"kernel-id">> => <<"nope">>, <<"input-data">> => [1]})}, #{}),
    #{<<"status">> := 400, <<"reason">> := <<"kernel_not_found">>, <<"error">> := _,
      <<"content-type">> := <<"application/json">>, <<"body">> := Body} = Reply,
    %% The detail only in the body (it may quote a stranger's kernel: never
    %% a header, kem_reply); error and reason in both.
    ?assertNot(maps:is_key(<<"details">>, Reply)),
    {ok, Decoded = #{<<"details">> := Details}} = kem_json:decode(Body),
    ?assertEqual(maps:with([<<"error">>, <<"reason">>], Reply), maps:with([<<"error">>, <<"reason">>], Decoded)),
    %% The port itself names no directory any more (issue 13); dev_kem's
    %% `<path>' masking stays as a backstop.
    {error, {kernel_not_found, Raw}} = kem:execute(<<"nope">>, <<1>>, #{}),
    ?assertEqual(nomatch, binary:match(Raw, <<"/">>)),
    ?assertEqual(nomatch, binary:match(Details, <<"/">>)),
    %% A bad request: same shape.
    {error, #{<<"status">> := 400, <<"reason">> := <<"bad_request">>, <<"body">> := Bad}} =
        dev_kem:execute_kernel(#{}, #{<<"body">> => <<"{not json">>}, #{}),
    ?assertMatch({ok, #{<<"reason">> := <<"bad_request">>}}, kem_json:decode(Bad)).

encoded_image_files_are_refused() ->
    Png = <<16#89, "PNG", 16#0D, 16#0A, 16#1A, 16#0A, (crypto:strong_rand_bytes(60))/binary>>,
    Jpeg = <<16#FF, 16#D8, 16#FF, 16#E0, (crypto:strong_rand_bytes(60))/binary>>,
    [begin
         Req = #{<<"content-type">> => <<"application/octet-stream">>, <<"body">> => File,
                 <<"kernel-id">> => <<"pixelize">>, <<"params">> => <<"4,4,2,0">>},
         {error, #{<<"status">> := 415, <<"reason">> := <<"encoded_image">>} = Refused} =
             dev_kem:execute_kernel_with_params(#{}, Req, #{}),
         D = body_details(Refused),
         ?assertNotEqual(nomatch, binary:match(D, Kind))
     end || {File, Kind} <- [{Png, <<"PNG">>}, {Jpeg, <<"JPEG">>}]].

adapter_info_has_the_original_types() ->
    {ok, #{<<"status">> := 200, <<"content-type">> := <<"application/json">>, <<"body">> := Json}} =
        dev_kem:get_adapter_info(#{}, #{}, #{}),
    {ok, Info} = kem_json:decode(Json),
    #{<<"name">> := Name, <<"vendor">> := Vendor, <<"device">> := Device, <<"driver">> := Driver,
      <<"backend">> := Backend, <<"driver_info">> := DriverInfo} = Info,
    ?assert(is_binary(Name) andalso is_binary(Driver) andalso is_binary(DriverInfo)),
    ?assert(is_integer(Vendor) andalso is_integer(Device)),
    ?assertEqual(string:lowercase(Backend), Backend),
    {ok, Cwd} = file:get_cwd(),
    ?assertEqual(nomatch, binary:match(Json, list_to_binary(Cwd))),
    ?assertEqual(nomatch, binary:match(Json, <<"cache_dir">>)),
    %% kem_nif keeps the same types.
    {ok, Nif} = kem_json:decode(kem_nif:adapter_info()),
    ?assertEqual({Vendor, Device, Backend}, {maps:get(<<"vendor">>, Nif), maps:get(<<"device">>, Nif),
                                             maps:get(<<"backend">>, Nif)}).

usage_is_reported() ->
    Input = crypto:strong_rand_bytes(4000),
    {ok, Out, Usage} = kem:execute(?DOUBLE, Input, #{output_size_hint => 2, usage => true}),
    ?assertEqual(double_ref(Input, 8000), Out),
    ?assertMatch(#{kernel_id := ?DOUBLE, bytes_in := 4000, bytes_out := 8000, clock := wall}, Usage),
    ?assert(maps:get(us, Usage) > 0),
    %% Without the option the reply keeps its shape.
    ?assertMatch({ok, <<_/binary>>}, kem:execute(?DOUBLE, Input, #{})),
    Req = #{<<"content-type">> => <<"application/octet-stream">>, <<"body">> => Input,
            <<"kernel-id">> => ?DOUBLE},
    {ok, Reply} = dev_kem:execute_kernel(#{}, Req, #{}),
    ?assertMatch(#{<<"kem-usage-kernel-id">> := ?DOUBLE, <<"kem-usage-bytes-in">> := 4000,
                   <<"kem-usage-bytes-out">> := 4000, <<"kem-usage-clock">> := <<"wall">>}, Reply),
    ?assert(maps:get(<<"kem-usage-us">>, Reply) > 0).

metrics_count_and_survive_a_port_restart() ->
    Before = samples(page()),
    N = 3 + rand:uniform(5),
    [{ok, _} = kem:execute(?DOUBLE, crypto:strong_rand_bytes(100), #{}) || _ <- lists:seq(1, N)],
    {error, _} = kem:execute(<<"nope">>, <<1>>, #{}),
    Mid = samples(page()),
    Calls = <<"kem_calls_total{method=\"execute\"}">>,
    NotFound = <<"kem_errors_total{reason=\"kernel_not_found\"}">>,
    Count = <<"kem_call_duration_seconds_count{method=\"execute\"}">>,
    Inf = <<"kem_call_duration_seconds_bucket{method=\"execute\",le=\"+Inf\"}">>,
    ?assertEqual(N + 1, delta(Calls, Before, Mid)),
    ?assertEqual(1, delta(NotFound, Before, Mid)),
    ?assertEqual(N + 1, delta(Count, Before, Mid)),
    ?assertEqual(maps:get(Count, Mid), maps:get(Inf, Mid)),
    ?assertEqual(100 * N + 1, delta(<<"kem_bytes_in_total">>, Before, Mid)),
    %% Kill the port: its own stats restart at zero, kem's counters do not.
    Starts = <<"kem_port_starts_total{port=\"kem_port_1\"}">>,
    OsPid = kem_port:os_pid(kem_port_1),
    os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    ok = wait_for_new_port(OsPid, 200),
    {ok, _} = kem:execute(?DOUBLE, <<1, 2, 3, 4>>, #{}),
    After = samples(page()),
    ?assertEqual(1, delta(Starts, Mid, After)),
    ?assertEqual(1, delta(<<"kem_port_exits_total{port=\"kem_port_1\"}">>, Mid, After)),
    ?assert(maps:get(Calls, After) >= maps:get(Calls, Mid) + 1).

wait_for_new_port(_Old, 0) -> timeout;
wait_for_new_port(Old, Tries) ->
    timer:sleep(50),
    case catch kem_port:os_pid(kem_port_1) of
        New when is_integer(New), New =/= Old -> ok;
        _ -> wait_for_new_port(Old, Tries - 1)
    end.

page() ->
    {ok, Text} = kem:metrics(),
    Text.

%% Prometheus text -> #{<<"name{labels}">> => number}; also checks each
%% family has its HELP and TYPE lines first.
samples(Text) ->
    Lines = binary:split(Text, <<"\n">>, [global, trim_all]),
    Typed = [Name || <<"# TYPE ", Rest/binary>> <- Lines, [Name | _] <- [binary:split(Rest, <<" ">>)]],
    Samples = [begin
                   [Key, Value] = binary:split(L, <<" ">>, [trim_all]),
                   {Key, number(Value)}
               end || L <- Lines, binary:first(L) =/= $#],
    [?assert(lists:any(fun(T) -> binary:longest_common_prefix([T, K]) =:= byte_size(T) end, Typed))
     || {K, _} <- Samples],
    maps:from_list(Samples).

number(B) ->
    try binary_to_integer(B) catch error:badarg -> binary_to_float(B) end.

delta(Key, Before, After) ->
    maps:get(Key, After, 0) - maps:get(Key, Before, 0).
