%%% @doc The operators' dashboard (issue 26, docs/dashboard.md) on the real
%%% port: `kem:dashboard/0' is the page with the figures of now inside,
%%% `kem:dashboard_data/0' counts known calls and errors by kernel and
%%% reason, with percentiles within the measured wall times; the recorder's
%%% percentiles against exact ones on random samples; the cap of tracked
%%% kernels; `dev_kem''s keys over real HTTP (inets httpd as the node);
%%% nothing that names a pid or a node path, and a kernel id that is
%%% markup never reaches the page as markup.
-module(kem_dashboard_tests).
-include_lib("eunit/include/eunit.hrl").

-define(DOUBLE, <<"double">>).
%% Pids, ports and refs as Erlang prints them, OS pids as the health map
%% names them, and absolute paths under the usual roots.
-define(LEAKS, "<0\\.[0-9]+\\.[0-9]+>|#Port<|#Ref<|os_pid|\"/(tmp|home|root|usr|var|srv|opt|dev)/").

dashboard_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 120, fun data_counts_known_calls_and_errors/0},
      {timeout, 60, fun page_is_html_with_the_figures_inside/0},
      {timeout, 60, fun markup_in_a_kernel_id_stays_text/0},
      {timeout, 60, fun dev_kem_keys_over_real_http/0},
      {timeout, 60, fun quarantined_kernels_are_listed/0},
      {timeout, 300, fun kernels_past_the_cap_are_counted_as_other/0}]}.

start() ->
    {ok, _} = application:ensure_all_started(inets),
    Source = read_double(),
    Kernels = [{"k" ++ integer_to_list(I), Source} || I <- lists:seq(1, 52)],
    kem_test_app:start_with_kernels("kem_dashboard", Kernels, [{spares, 0}]).

stop(Started) ->
    kem_test_app:stop_with_kernels(Started).

read_double() ->
    {ok, Source} = file:read_file(filename:join([kem_test_app:repo_root(), "kem_port", "kernels", "double.wgsl"])),
    Source.

kernel(Data, Id) ->
    [K] = [K || K <- maps:get(<<"kernels">>, Data), maps:get(<<"kernel">>, K) =:= Id],
    K.

no_leaks(Text) ->
    ?assertEqual(nomatch, re:run(Text, ?LEAKS, [{capture, first, binary}])).

%% N calls of double on fresh random inputs, M of a kernel that does not
%% exist: the figures say N, M and kernel_not_found, and the percentiles
%% lie within the wall times the test measured itself (10% for the buckets).
data_counts_known_calls_and_errors() ->
    N = 5 + rand:uniform(10),
    M = 1 + rand:uniform(4),
    Walls = [begin
                 Input = crypto:strong_rand_bytes(4 * rand:uniform(512)),
                 T0 = erlang:monotonic_time(microsecond),
                 Reply = kem:execute(?DOUBLE, Input, #{}),
                 Us = erlang:monotonic_time(microsecond) - T0,
                 ?assertEqual({ok, kem_ref:double_ref(Input, byte_size(Input))}, Reply),
                 Us
             end || _ <- lists:seq(1, N)],
    [?assertMatch({error, {kernel_not_found, _}}, kem:execute(<<"no_such_kernel">>, <<1, 2, 3, 4>>, #{}))
     || _ <- lists:seq(1, M)],
    {ok, Data} = kem:dashboard_data(),
    Double = kernel(Data, ?DOUBLE),
    ?assertEqual(N, maps:get(<<"calls">>, Double)),
    ?assertEqual(0, maps:get(<<"errors">>, Double)),
    P50 = maps:get(<<"p50_ms">>, Double), P90 = maps:get(<<"p90_ms">>, Double), P99 = maps:get(<<"p99_ms">>, Double),
    ?assert(P50 =< P90 andalso P90 =< P99),
    %% kem's own wall time is inside the test's: at most the test's, and
    %% the fastest call bounds p50 from below only loosely (kem's share).
    ?assert(P99 =< lists:max(Walls) / 1000 * 1.1),
    ?assert(lists:sum(maps:get(<<"series">>, Double)) > 0),
    ?assertEqual(kem_dashboard_stats:window_slots(), length(maps:get(<<"series">>, Double))),
    %% The failed calls of an unknown kernel take no place: under (other).
    Other = kernel(Data, <<"(other)">>),
    ?assertEqual(M, maps:get(<<"errors">>, Other)),
    ?assertEqual(true, maps:get(<<"other">>, Other)),
    #{<<"window">> := Window, <<"total">> := Total} = maps:get(<<"errors">>, Data),
    ?assertEqual(M, maps:get(<<"kernel_not_found">>, Window)),
    ?assertEqual(M, maps:get(<<"kernel_not_found">>, Total)),
    ?assertEqual(N + M, maps:get(<<"execute">>, maps:get(<<"methods">>, Data))),
    %% Every port, up, with its adapter; the groups; memory summed.
    Ports = maps:get(<<"ports">>, Data),
    ?assertEqual([atom_to_binary(P) || P <- kem_sup:port_names()], [maps:get(<<"name">>, P) || P <- Ports]),
    [?assertMatch(#{<<"up">> := true, <<"usable">> := true}, P) || P <- Ports],
    ?assertEqual(length(kem:adapters()), length(maps:get(<<"adapters">>, Data))),
    ?assert(maps:get(<<"pool_live_bytes">>, maps:get(<<"memory">>, Data)) > 0),
    ?assertEqual(#{<<"open">> => 0, <<"bytes">> => 0}, maps:get(<<"sessions">>, Data)),
    %% One node alone: no other kem node forwarded to or heard from.
    ?assertEqual([], maps:get(<<"cluster">>, Data)),
    %% An open session with a buffer shows in the figures.
    {ok, S} = kem:session_open(#{}),
    ok = kem:buffer_create(S, <<"b">>, 4096),
    %% A session call is counted where it ends too (kem:counted).
    Input = crypto:strong_rand_bytes(256),
    ?assertEqual({ok, kem_ref:double_ref(Input, 256)}, kem:session_call(S, ?DOUBLE, Input, #{})),
    {ok, Open} = kem:dashboard_data(),
    ?assertEqual(N + 1, maps:get(<<"calls">>, kernel(Open, ?DOUBLE))),
    ?assertMatch(#{<<"open">> := 1}, maps:get(<<"sessions">>, Open)),
    ?assert(maps:get(<<"bytes">>, maps:get(<<"sessions">>, Open)) >= 4096),
    ok = kem:session_close(S),
    no_leaks(kem_json:encode(Data)).

page_is_html_with_the_figures_inside() ->
    {ok, Html} = kem:dashboard(),
    ?assertMatch(<<"<!DOCTYPE html>", _/binary>>, Html),
    ?assertEqual(nomatch, binary:match(Html, <<"__KEM_SNAPSHOT__">>)),
    [_, After] = binary:split(Html, <<"<script type=\"application/json\" id=\"kem-snapshot\">">>),
    [Json, _] = binary:split(After, <<"</script>">>),
    {ok, Snapshot} = kem_json:decode(Json),
    ?assertEqual(kem_sup:port_names(), [binary_to_atom(maps:get(<<"name">>, P)) || P <- maps:get(<<"ports">>, Snapshot)]),
    %% No CDN or other origin: the page is whole offline.
    ?assertEqual(nomatch, re:run(Html, "(src|href)=\"(https?:)?//", [{capture, none}])),
    no_leaks(Html).

%% A kernel id is a stranger's text: inside the page's JSON `<' is
%% escaped, so it cannot close the element; the page writes it as text
%% (checked in a real browser by tests/test_dashboard_browser.py).
markup_in_a_kernel_id_stays_text() ->
    Id = <<"</script><img src=x onerror=alert(1)>">>,
    ok = kem_dashboard_stats:call_done(Id, {ok, <<>>}, 2000),
    {ok, Data} = kem:dashboard_data(),
    ?assertEqual(1, maps:get(<<"calls">>, kernel(Data, Id))),
    {ok, Html} = kem:dashboard(),
    ?assertEqual(nomatch, binary:match(Html, <<"<img">>)),
    ?assertEqual(2, length(binary:matches(Html, <<"</script>">>))),  % the two elements' own
    kem_dashboard_stats:prune(kem_dashboard_stats:slot() + kem_dashboard_stats:window_slots()).

dev_kem_keys_over_real_http() ->
    Node = kem_dashboard_node:start(),
    try
        {_, Port, _} = Node,
        Url = fun(Key) -> "http://127.0.0.1:" ++ integer_to_list(Port) ++ "/~kem@1.0/" ++ Key end,
        Input = crypto:strong_rand_bytes(64),
        Body = kem_json:encode(#{<<"kernel_id">> => ?DOUBLE, <<"input_data">> => binary_to_list(Input)}),
        {ok, {{_, 200, _}, _, Out}} = httpc:request(post, {Url("execute_kernel"), [], "application/json", Body},
                                                    [{timeout, 30000}], [{body_format, binary}]),
        ?assertEqual(kem_ref:double_ref(Input, 64), Out),
        {ok, {{_, 200, _}, Headers, Page}} = httpc:request(get, {Url("dashboard"), []}, [{timeout, 30000}],
                                                           [{body_format, binary}]),
        ?assertEqual("text/html; charset=utf-8", proplists:get_value("content-type", Headers)),
        %% The policy names the hash of the page's one script: only it runs.
        [_, Script0] = binary:split(Page, <<"<script>">>),
        [Script, _] = binary:split(Script0, <<"</script>">>),
        Hash = base64:encode(crypto:hash(sha256, Script)),
        Policy = list_to_binary(proplists:get_value("content-security-policy", Headers)),
        ?assertNotEqual(nomatch, binary:match(Policy, <<"script-src 'sha256-", Hash/binary, "'">>)),
        {ok, {{_, 200, _}, DataHeaders, Json}} = httpc:request(get, {Url("dashboard_data"), []}, [{timeout, 30000}],
                                                               [{body_format, binary}]),
        ?assertEqual("application/json", proplists:get_value("content-type", DataHeaders)),
        {ok, Data} = kem_json:decode(Json),
        {ok, Direct} = kem:dashboard_data(),
        ?assertEqual(maps:get(<<"calls">>, kernel(Direct, ?DOUBLE)), maps:get(<<"calls">>, kernel(Data, ?DOUBLE))),
        no_leaks(Json)
    after
        kem_dashboard_node:stop(Node)
    end.

%% A kernel quarantined (as kem_quarantine:on_timeout/4 does after a
%% runaway call) is listed with its scope and the seconds left; its
%% refused call counts as a `quarantined' error.
quarantined_kernels_are_listed() ->
    ok = kem_quarantine:add(<<"k7">>),
    ok = kem_quarantine:add({chain, <<"k8">>}),
    try
        ?assertMatch({error, {quarantined, _}}, kem:execute(<<"k7">>, <<1, 2, 3, 4>>, #{})),
        {ok, Data} = kem:dashboard_data(),
        Listed = lists:sort([{maps:get(<<"kernel">>, Q), maps:get(<<"scope">>, Q)} || Q <- maps:get(<<"quarantined">>, Data)]),
        ?assertEqual([{<<"k7">>, <<"all calls">>}, {<<"k8">>, <<"chains">>}], Listed),
        [?assert(S > 50 andalso S =< 60) || #{<<"seconds_left">> := S} <- maps:get(<<"quarantined">>, Data)],
        ?assertMatch(#{<<"quarantined">> := N} when N >= 1, maps:get(<<"window">>, maps:get(<<"errors">>, Data)))
    after
        ets:delete(kem_quarantine, <<"k7">>),
        ets:delete(kem_quarantine, {chain, <<"k8">>})
    end.

%% 52 kernels with a successful call each: 50 take a place, the other two
%% are counted under (other); once the window has passed, the places are
%% free again.
kernels_past_the_cap_are_counted_as_other() ->
    Cap = kem_dashboard_stats:max_kernels(),
    kem_dashboard_stats:prune(kem_dashboard_stats:slot() + kem_dashboard_stats:window_slots()),
    Input = crypto:strong_rand_bytes(16),
    [?assertEqual({ok, kem_ref:double_ref(Input, 16)}, kem:execute(<<"k", (integer_to_binary(I))/binary>>, Input, #{}))
     || I <- lists:seq(1, Cap + 2)],
    {ok, Data} = kem:dashboard_data(),
    Named = [K || K <- maps:get(<<"kernels">>, Data), not maps:get(<<"other">>, K)],
    ?assertEqual(Cap, length(Named)),
    ?assertEqual(2, maps:get(<<"calls">>, kernel(Data, <<"(other)">>))),
    kem_dashboard_stats:prune(kem_dashboard_stats:slot() + kem_dashboard_stats:window_slots()),
    {ok, Empty} = kem:dashboard_data(),
    ?assertEqual([], maps:get(<<"kernels">>, Empty)),
    ?assertEqual({ok, kem_ref:double_ref(Input, 16)}, kem:execute(<<"k52">>, Input, #{})),
    {ok, Again} = kem:dashboard_data(),
    ?assertEqual(1, maps:get(<<"calls">>, kernel(Again, <<"k52">>))).

%%% the recorder alone: percentiles against exact ones

percentiles_within_ten_percent_test() ->
    [begin
         Samples = [1 + trunc(math:exp(rand:uniform() * Spread)) || _ <- lists:seq(1, Size)],
         Buckets = lists:foldl(fun(Us, Acc) -> B = kem_dashboard_stats:bucket(Us), setelement(B + 1, Acc, element(B + 1, Acc) + 1) end,
                               erlang:make_tuple(108, 0), Samples),
         Sorted = lists:sort(Samples),
         [begin
              Exact = lists:nth(max(1, ceil(P / 100 * Size)), Sorted),
              Got = kem_dashboard_stats:percentile(P, tuple_to_list(Buckets)),
              ?assert(Got >= Exact / 1.1 andalso Got =< Exact * 1.1, {P, Size, Exact, Got})
          end || P <- [50, 90, 99]]
     end || Size <- [1, 7, 100, 5000], Spread <- [2.0, 8.0, 15.0]],
    ?assertEqual(null, kem_dashboard_stats:percentile(50, lists:duplicate(108, 0))).
