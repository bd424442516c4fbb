%%% @doc Gas in the usage record (issue 27, docs/metering.md), on the real
%%% port: dev_kem's `kem-usage-gas' equals the count worked by hand (a
%%% looping kernel: invocations launched + each invocation's iterations; a
%%% loop-free one: invocations), through the pipe, the lone road and a
%%% shared-memory result; the metering hook is handed `kem-gas';
%%% `gas-limit' bounds a dev_kem call (402 past it, 400 for a bad value),
%%% over real HTTP too; `kem:execute/3' without `usage' answers exactly as
%%% before.
-module(kem_gas_usage_tests).
-include_lib("eunit/include/eunit.hrl").
-include_lib("inets/include/httpd.hrl").
-export([do/1]).

-define(WG, 64).

%% out[i] = 3 * in[i] + 1: no loop, gas = invocations launched.
affine() -> <<"
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x >= arrayLength(&out)) { return; }
  out[g.x] = 3u * inp[g.x] + 1u;
}
">>.

gas_usage_test_() ->
    {setup,
     fun() ->
             {ok, _} = application:ensure_all_started(inets),
             kem_test_app:start_with_kernels("kem_gas_usage", [{"counting", kem_test_app:counting_kernel()}, {"affine", affine()}], [])
     end,
     fun kem_test_app:stop_with_kernels/1,
     [{timeout, 60, fun dev_kem_counts_a_looping_kernel_by_hand/0},
      {timeout, 60, fun dev_kem_counts_a_loop_free_kernel_by_its_invocations/0},
      {timeout, 60, fun a_shared_memory_result_keeps_its_gas/0},
      {timeout, 60, fun execute_answers_as_before_without_usage/0},
      {timeout, 60, fun the_metering_hook_is_handed_gas/0},
      {timeout, 60, fun dev_kem_takes_a_gas_limit/0},
      {timeout, 60, fun a_bad_gas_limit_is_a_400/0},
      {timeout, 60, fun over_real_http/0},
      {timeout, 120, fun what_asking_costs/0}]}.

words(List) -> << <<W:32/little>> || W <- List >>.

%% Invocations of the kernels' default dispatch: workgroups of 64 over the output's words.
launched(Words) -> (Words + ?WG - 1) div ?WG * ?WG.

request(Kernel, Input, Extra) ->
    maps:merge(#{<<"kernel-id">> => Kernel, <<"body">> => Input,
                 <<"content-type">> => <<"application/octet-stream">>}, Extra).

call(Kernel, Input, Extra) -> dev_kem:execute_kernel(#{}, request(Kernel, Input, Extra), #{}).

dev_kem_counts_a_looping_kernel_by_hand() ->
    %% The issue's example: 64 invocations x 10 iterations = 64 + 640.
    {ok, #{<<"kem-usage-gas">> := 704, <<"body">> := Tens}} = call(<<"counting">>, words(lists:duplicate(64, 10)), #{}),
    ?assertEqual(words(lists:duplicate(64, 45)), Tens),
    [begin
         In = [rand:uniform(41) - 1 || _ <- lists:seq(1, N)],
         {ok, #{<<"kem-usage-gas">> := Gas, <<"body">> := Out}} = call(<<"counting">>, words(In), #{}),
         ?assertEqual(words([K * (K - 1) div 2 || K <- In]), Out, N),
         ?assertEqual(launched(N) + lists:sum(In), Gas, N)
     end || N <- [1, 63, 64, 65, 300, 5000]].

dev_kem_counts_a_loop_free_kernel_by_its_invocations() ->
    [begin
         In = [rand:uniform(1 bsl 20) || _ <- lists:seq(1, N)],
         Want = words([3 * X + 1 || X <- In]),
         %% Twice: the first call may take the batch road, the next the reader's lone road (a kit).
         [{ok, #{<<"kem-usage-gas">> := G1, <<"body">> := Want}},
          {ok, #{<<"kem-usage-gas">> := G2, <<"body">> := Want}}] = [call(<<"affine">>, words(In), #{}) || _ <- [1, 2]],
         ?assertEqual({launched(N), launched(N)}, {G1, G2}, N)
     end || N <- [1, 64, 100, 1000, 16384]],
    %% Workgroups given: what they launch, 5 x 64, past the data too.
    {ok, #{<<"kem-usage-gas">> := 320}} = call(<<"affine">>, words(lists:seq(1, 100)), #{<<"workgroups">> => <<"5,1,1">>}).

a_shared_memory_result_keeps_its_gas() ->
    %% 1 MiB and up travel as files (kem_shm): the gas comes back beside the file's name.
    Words = 300000,
    In = [rand:uniform(1 bsl 20) || _ <- lists:seq(1, Words)],
    {ok, #{<<"kem-usage-gas">> := Gas, <<"body">> := Out}} = call(<<"affine">>, words(In), #{}),
    ?assertEqual(words([3 * X + 1 || X <- In]), Out),
    ?assertEqual(launched(Words), Gas),
    {ok, Out, #{gas := Gas}} = kem:execute(<<"affine">>, words(In), #{usage => true}).

execute_answers_as_before_without_usage() ->
    In = [rand:uniform(30) || _ <- lists:seq(1, 200)],
    Want = words([K * (K - 1) div 2 || K <- In]),
    ?assertEqual({ok, Want}, kem:execute(<<"counting">>, words(In), #{})),
    ?assertEqual({ok, Want}, kem:call(execute_kernel, {<<"counting">>, words(In), 1}, 5000)),
    {ok, Want, Usage} = kem:execute(<<"counting">>, words(In), #{usage => true}),
    ?assertEqual(launched(200) + lists:sum(In), maps:get(gas, Usage)),
    %% request_usage/2 and call_usage/3: the record has gas, the reply is the bare result.
    {{ok, Want}, #{gas := G}} = kem:request_usage(execute_kernel, {<<"counting">>, words(In), 1}),
    {{ok, Want}, #{gas := G}} = kem:call_usage(execute_kernel, {<<"counting">>, words(In), 1}, 5000),
    ?assertEqual(launched(200) + lists:sum(In), G),
    %% A debug call keeps its map, gas in it (docs/debug.md).
    {ok, Want, #{debug := #{gas := G}}} = kem:execute(<<"counting">>, words(In), #{debug => true}).

%% HyperBEAM's dev_metering is not here: a module of that name, loaded for
%% this test only, keeps what kem_metering hands it in the caller's
%% process dictionary, as HyperBEAM's keeps its meters.
the_metering_hook_is_handed_gas() ->
    load_meter(),
    try
        {ok, #{<<"kem-usage-gas">> := 704}} = call(<<"counting">>, words(lists:duplicate(64, 10)), #{}),
        ?assertEqual(704, get({kem_test_meter, <<"kem-gas">>})),
        ?assertEqual(256, get({kem_test_meter, <<"kem-bytes-in">>}))
    after
        unload_meter()
    end.

load_meter() ->
    Lines = ["-module(dev_metering).", "-export([meter/3]).", "meter(R, A, _) -> put({kem_test_meter, R}, A), ok."],
    Forms = [begin {ok, T, _} = erl_scan:string(L), {ok, F} = erl_parse:parse_form(T), F end || L <- Lines],
    {ok, dev_metering, Bin} = compile:forms(Forms),
    {module, dev_metering} = code:load_binary(dev_metering, "dev_metering.erl", Bin),
    forget_meter().

unload_meter() ->
    _ = code:purge(dev_metering),
    _ = code:delete(dev_metering),
    _ = code:purge(dev_metering),
    forget_meter().

forget_meter() ->
    [persistent_term:erase({kem_optional, dev_metering, F, 3}) || F <- [meter, consume]],
    ok.

dev_kem_takes_a_gas_limit() ->
    Tens = words(lists:duplicate(64, 10)),
    {error, #{<<"status">> := 402, <<"reason">> := <<"gas_exhausted">>}} = call(<<"counting">>, Tens, #{<<"gas-limit">> => <<"703">>}),
    {ok, #{<<"status">> := 200, <<"kem-usage-gas">> := 704}} = call(<<"counting">>, Tens, #{<<"gas-limit">> => <<"704">>}),
    {ok, #{<<"kem-usage-gas">> := 704}} = call(<<"counting">>, Tens, #{<<"gas-limit">> => 704}),  % a typed integer
    %% A loop-free kernel: launching past the limit is refused before it runs.
    {error, #{<<"status">> := 402}} = call(<<"affine">>, words(lists:seq(1, 100)), #{<<"gas-limit">> => <<"127">>}),
    {ok, #{<<"kem-usage-gas">> := 128}} = call(<<"affine">>, words(lists:seq(1, 100)), #{<<"gas-limit">> => <<" 128 ">>}).

a_bad_gas_limit_is_a_400() ->
    [begin
         {error, #{<<"status">> := 400, <<"reason">> := <<"bad_args">>} = R} = call(<<"counting">>, words([1]), #{<<"gas-limit">> => Bad}),
         {ok, #{<<"details">> := D}} = kem_json:decode(maps:get(<<"body">>, R)),
         ?assertNotEqual(nomatch, binary:match(D, <<"gas-limit">>), Bad)
     end || Bad <- [<<"0">>, <<"-5">>, <<"abc">>, <<"1.5">>, <<>>, 0, 1.0e9, 1 bsl 63,
                    integer_to_binary(1 bsl 63), binary:copy(<<"9">>, 100_000)]],
    ?assertEqual({ok, words([0])}, kem:execute(<<"counting">>, words([1]), #{})).  % the port still answers

%%% over HTTP: inets httpd plays the node, as in dev_kem_dispatch_tests

%% @private httpd's callback: every header a message key, the body `body'.
do(#mod{parsed_header = Headers, entity_body = Body}) ->
    Msg = maps:from_list([{list_to_binary(K), list_to_binary(V)} || {K, V} <- Headers]),
    {Status, Reply} = case dev_kem:execute_kernel(#{}, Msg#{<<"body">> => list_to_binary(Body)}, #{}) of
                          {ok, R} -> {maps:get(<<"status">>, R, 200), R};
                          {error, R} -> {maps:get(<<"status">>, R, 500), R}
                      end,
    Out = maps:get(<<"body">>, Reply, <<>>),
    Hdrs = [{binary_to_list(K), text(V)} || {K, V} <- maps:to_list(Reply), K =/= <<"body">>, K =/= <<"status">>],
    {proceed, [{response, {response, [{code, Status}, {content_length, integer_to_list(byte_size(Out))} | Hdrs],
                           binary_to_list(Out)}}]}.

text(V) when is_integer(V) -> integer_to_list(V);
text(V) when is_binary(V) -> binary_to_list(V).

over_real_http() ->
    Dir = filename:join("/tmp", "kem_gas_usage_httpd_" ++ os:getpid()),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    {ok, Httpd} = inets:start(httpd, [{port, 0}, {bind_address, {127, 0, 0, 1}}, {server_name, "kem"},
                                      {server_root, Dir}, {document_root, Dir}, {modules, [?MODULE]}]),
    try
        [{port, Port}] = httpd:info(Httpd, [port]),
        Url = "http://127.0.0.1:" ++ integer_to_list(Port) ++ "/~kem@1.0/execute_kernel",
        Post = fun(Limit, Input) ->
                   httpc:request(post, {Url, [{"kernel-id", "counting"}, {"gas-limit", Limit}], "application/octet-stream", Input},
                                 [{timeout, 30000}], [{body_format, binary}])
               end,
        In = [rand:uniform(20) || _ <- lists:seq(1, 100)],
        %% The limit is shared evenly (docs/metering.md): each of the 128
        %% invocations may loop as often as the one that loops most.
        Enough = launched(100) * (1 + lists:max(In)),
        {ok, {{_, 200, _}, Headers, Out}} = Post(integer_to_list(Enough), words(In)),
        ?assertEqual(words([K * (K - 1) div 2 || K <- In]), Out),
        ?assertEqual(integer_to_list(launched(100) + lists:sum(In)), proplists:get_value("kem-usage-gas", Headers)),
        {ok, {{_, 402, _}, _, Body}} = Post(integer_to_list(Enough - 1), words(In)),
        {ok, #{<<"reason">> := <<"gas_exhausted">>}} = kem_json:decode(Body),
        {ok, {{_, 400, _}, _, _}} = Post("lots", words(In))
    after
        inets:stop(httpd, Httpd),
        file:del_dir_r(Dir)
    end.

%% Figures, not a bound (this machine is shared): the same small call to
%% a loop-free kernel, interleaved: the hot execute_kernel frame, asking
%% for its gas (its usage form, as dev_kem asks), execute with options, and
%% execute asking for its gas (usage => true).
what_asking_costs() ->
    In = words(lists:seq(1, 1024)),
    Want = words([3 * X + 1 || X <- lists:seq(1, 1024)]),
    Ways = [{"execute_kernel (the hot frame)", fun() -> kem:call(execute_kernel, {<<"affine">>, In, 1}, 5000) end},
            {"execute_kernel asking usage (the hot frame + usage: dev_kem's)",
             fun() -> {{ok, Out}, #{gas := 1024}} = kem:call_usage(execute_kernel, {<<"affine">>, In, 1}, 5000), {ok, Out} end},
            {"execute, no usage", fun() -> kem:execute(<<"affine">>, In, #{}) end},
            {"execute, usage => true", fun() -> {ok, Out, #{gas := 1024}} = kem:execute(<<"affine">>, In, #{usage => true}),
                                               {ok, Out} end}],
    [{ok, Want} = F() || _ <- lists:seq(1, 100), {_, F} <- Ways],
    Rounds = [[{Name, round_us(F)} || {Name, F} <- Ways] || _ <- lists:seq(1, 15)],
    [io:format(user, "~n~s: median ~.1f us a call (15 rounds of 100, interleaved)",
               [Name, median([Us || Round <- Rounds, {N, Us} <- Round, N =:= Name])]) || {Name, _} <- Ways],
    io:format(user, "~n", []).

round_us(F) ->
    T0 = erlang:monotonic_time(microsecond),
    [{ok, _} = F() || _ <- lists:seq(1, 100)],
    (erlang:monotonic_time(microsecond) - T0) / 100.

median(Xs) -> lists:nth((length(Xs) + 1) div 2, lists:sort(Xs)).
