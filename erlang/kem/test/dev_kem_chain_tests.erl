%%% @doc eunit tests of `dev_kem:execute_chain/3' speaking the general
%%% binding model (issue 25): a step's `buffers', `outputs' and
%%% `constants', in a JSON body (bytes as integer arrays) and in a
%%% message's map body (bytes as binaries, as `run' takes them), on the
%%% real Python port against Erlang references on fresh random data of
%%% three sizes; named results answered as `run' answers them; refusals
%%% naming the step and the field; the request budget counting a
%%% kem@1.0-shaped step with `outputs' as the port allocates it; and one
%%% exchange over real HTTP (inets httpd plays the node).
-module(dev_kem_chain_tests).
-include_lib("eunit/include/eunit.hrl").
-include_lib("inets/include/httpd.hrl").

-export([do/1]).

-include("kem_named_kernels.hrl").
%% d = c * factor, by name: binding 1 is `read', so not kem@1.0-shaped.
-define(TIMES, <<"override factor: u32 = 1u;
@group(0) @binding(1) var<storage, read> c: array<u32>;
@group(0) @binding(2) var<storage, read_write> d: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&d)) { d[i] = c[i] * factor; }
}
">>).
%% kem@1.0-shaped (bindings 0 and 1) with a named buffer at binding 3.
-define(PLUS_MARK, <<"@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(3) var<storage, read_write> mark: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&output_words)) { output_words[i] = input_words[i] + 1u; }
    if (i < arrayLength(&mark)) { mark[i] = 7u; }
}
">>).

chain_test_() ->
    {setup,
     fun() ->
             {ok, _} = application:ensure_all_started(inets),
             kem_test_app:start_with_kernels("dev_kem_chain", [{"add", ?ADD}, {"times", ?TIMES},
                                                                {"plus_mark", ?PLUS_MARK}], [])
     end,
     fun kem_test_app:stop_with_kernels/1,
     [{timeout, 60, fun json_body_two_inputs_then_a_constant/0},
      {timeout, 60, fun message_body_two_inputs_then_a_constant/0},
      {timeout, 60, fun bad_fields_name_the_step_and_field/0},
      {timeout, 60, fun over_the_request_budget_is_413/0},
      {timeout, 60, fun kem_shaped_step_with_outputs_makes_binding_1/0},
      {timeout, 60, fun the_port_counts_a_steps_work_against_the_request_budget/0},
      {timeout, 60, fun named_chain_over_real_http/0}]}.

from_words(Ws) -> << <<W:32/little>> || W <- Ws >>.
random_words(N) -> [rand:uniform(1 bsl 32) - 1 || _ <- lists:seq(1, N)].
sizes() -> [1, 64 + rand:uniform(64), 1000 + rand:uniform(1000)].

%% (a + b) * factor, mod 2^32, as the kernels compute it.
expected(A, B, K) -> from_words([((X + Y) band 16#FFFFFFFF) * K band 16#FFFFFFFF || {X, Y} <- lists:zip(A, B)]).

%% c = a + b (two inputs by name), then d = c * factor (an override).
steps(BufA, BufB, N, K) ->
    [#{<<"kernel-id">> => <<"add">>, <<"buffers">> => #{<<"a">> => BufA, <<"b">> => BufB},
       <<"outputs">> => #{<<"c">> => 4 * N}, <<"grid">> => [N, 1, 1]},
     #{<<"kernel_id">> => <<"times">>, <<"outputs">> => #{<<"d">> => 4 * N}, <<"constants">> => #{<<"factor">> => K},
       <<"workgroups">> => [(N + 63) div 64, 1, 1]}].

json(Map) -> dev_kem:execute_chain(#{}, #{<<"body">> => kem_json:encode(Map)}, #{}).
message(Map) -> dev_kem:execute_chain(#{}, #{<<"body">> => Map}, #{}).

%% A success's named results, name => bytes (run's reply shape).
buffers({ok, #{<<"status">> := 200, <<"buffers">> := Nested} = Reply}) ->
    ?assertNot(maps:is_key(<<"body">>, Reply)),
    {ok, maps:map(fun(_, #{<<"body">> := B}) -> B end, Nested)};
buffers(Other) -> Other.

details(Reply) ->
    {ok, #{<<"details">> := D}} = kem_json:decode(maps:get(<<"body">>, Reply)),
    D.

%% A refusal: Status, and a detail that begins "step N: " and holds Text.
assert_refused(Status, Step, Text, {error, Reply}) ->
    ?assertMatch(#{<<"status">> := Status}, Reply),
    D = details(Reply),
    Prefix = <<"step ", (integer_to_binary(Step))/binary, ": ">>,
    ?assertEqual(Prefix, binary:part(D, 0, min(byte_size(D), byte_size(Prefix))), D),
    ?assertNotEqual(nomatch, binary:match(D, Text), D);
assert_refused(_Status, _Step, _Text, Other) ->
    ?assertEqual(refused, Other).

%%% results

json_body_two_inputs_then_a_constant() ->
    lists:foreach(
        fun(N) ->
            A = random_words(N), B = random_words(N), K = 2 + rand:uniform(1000),
            Reply = json(#{<<"steps">> => steps(binary_to_list(from_words(A)), binary_to_list(from_words(B)), N, K)}),
            ?assertEqual({ok, #{<<"d">> => expected(A, B, K)}}, buffers(Reply)),
            {ok, R} = Reply,
            %% Usage as run's: every given buffer in, every result out.
            ?assertEqual(8 * N, maps:get(<<"kem-usage-bytes-in">>, R)),
            ?assertEqual(4 * N, maps:get(<<"kem-usage-bytes-out">>, R)),
            ?assertEqual(<<"add,times">>, maps:get(<<"kem-usage-kernel-id">>, R))
        end, sizes()),
    %% The constant changes the result: the kernel's default (1) without it.
    N = 100 + rand:uniform(100),
    A = random_words(N), B = random_words(N),
    [Add, Times] = steps(binary_to_list(from_words(A)), binary_to_list(from_words(B)), N, 1),
    ?assertEqual({ok, #{<<"d">> => expected(A, B, 1)}},
                 buffers(json(#{<<"steps">> => [Add, maps:remove(<<"constants">>, Times)]}))).

%% The same chain as a message (a Lua table, an ao message): binaries,
%% a part with its own headers, sizes and a constant as decimal text.
message_body_two_inputs_then_a_constant() ->
    lists:foreach(
        fun(N) ->
            A = random_words(N), B = random_words(N), K = 2 + rand:uniform(1000),
            Part = #{<<"content-type">> => <<"application/octet-stream">>, <<"body">> => from_words(B)},
            [Add, Times] = steps(from_words(A), Part, N, integer_to_binary(K)),
            %% A dispatch as a header gives it ("X,Y,Z"), and as a Lua array arrives (keys 1..3).
            Texts = Times#{<<"outputs">> => #{<<"d">> => integer_to_binary(4 * N)},
                           <<"workgroups">> => <<(integer_to_binary((N + 63) div 64))/binary, ", 1, 1">>},
            Lua = Add#{<<"grid">> => #{<<"1">> => N, <<"2">> => 1, <<"3">> => 1}},
            ?assertEqual({ok, #{<<"d">> => expected(A, B, K)}}, buffers(message(#{<<"steps">> => [Lua, Texts]}))),
            %% A float constant is refused by the port for a u32 override, naming it.
            assert_refused(400, 2, <<"factor">>,
                           message(#{<<"steps">> => [Add, Times#{<<"constants">> => #{<<"factor">> => 2.5}}]}))
        end, sizes()).

%%% refusals

bad_fields_name_the_step_and_field() ->
    N = 16, Bytes = from_words(random_words(N)),
    [Add, Times] = steps(binary_to_list(Bytes), binary_to_list(Bytes), N, 3),
    Json = fun(Steps) -> json(#{<<"steps">> => Steps}) end,
    %% A buffer the kernel does not bind (the port's check, by step).
    assert_refused(400, 1, <<"zz">>, Json([Add#{<<"buffers">> => #{<<"a">> => binary_to_list(Bytes),
                                                                     <<"b">> => binary_to_list(Bytes),
                                                                     <<"zz">> => [0, 0, 0, 0]}}, Times])),
    %% Bytes: a JSON string is text; out-of-range numbers; a message's numbers.
    assert_refused(400, 1, <<"buffer 'a'">>, Json([Add#{<<"buffers">> => #{<<"a">> => <<"AAAA">>, <<"b">> => [0]}}, Times])),
    assert_refused(400, 1, <<"buffer 'b'">>, Json([Add#{<<"buffers">> => #{<<"a">> => [0], <<"b">> => [256]}}, Times])),
    assert_refused(400, 1, <<"buffer 'a'">>, message(#{<<"steps">> => [Add#{<<"buffers">> => #{<<"a">> => [1, 2]}}]})),
    assert_refused(400, 1, <<"buffers must be">>, Json([Add#{<<"buffers">> => [1, 2, 3]}, Times])),
    %% Constants: not numbers, not names, NaN-like text.
    [assert_refused(400, 2, <<"constants">>, Json([Add, Times#{<<"constants">> => C}]))
     || C <- [#{<<"factor">> => <<"abc">>}, #{<<"factor">> => [1]}, #{<<"1x">> => 1}, [1, 2]]],
    [MAdd, MTimes] = steps(Bytes, Bytes, N, 3),
    [assert_refused(400, 2, <<"constants">>, message(#{<<"steps">> => [MAdd, MTimes#{<<"constants">> => C}]}))
     || C <- [#{<<"factor">> => <<"nan">>}, #{<<"factor">> => <<"inf">>}, #{<<"factor">> => <<"1e999">>}]],
    Many = maps:from_list([{<<"k", (integer_to_binary(I))/binary>>, I} || I <- lists:seq(1, 65)]),
    assert_refused(400, 2, <<"constants: at most 64">>, Json([Add, Times#{<<"constants">> => Many}])),
    %% Output sizes: integers >= 0 only.
    [assert_refused(400, 2, <<"output 'd'">>, Json([Add, Times#{<<"outputs">> => #{<<"d">> => S}}]))
     || S <- [1.5, -4, <<"12a">>, [4], #{<<"x">> => <<"y">>}]],
    assert_refused(400, 2, <<"outputs must be">>, Json([Add, Times#{<<"outputs">> => 64}])),
    %% Dispatches: three integers 1..2^32-1, one of grid or workgroups.
    [assert_refused(400, 2, <<"workgroups must be three integers">>, Json([Add, Times#{<<"workgroups">> => W}]))
     || W <- [[0, 1, 1], [1, 1], <<"a,b,c">>, [1.5, 1, 1], [1 bsl 32, 1, 1]]],
    assert_refused(400, 2, <<"not both">>, Json([Add, Times#{<<"grid">> => [1, 1, 1]}])),
    %% A field no step has (a typo) is named, not ignored.
    assert_refused(400, 2, <<"unknown field bufers">>, Json([Add, Times#{<<"bufers">> => #{}}])),
    %% Both spellings of one field in a step.
    assert_refused(400, 2, <<"twice">>, Json([Add, Times#{<<"kernel-id">> => <<"times">>}])),
    %% 65 buffers in one step: 413, before any is read.
    Lots = maps:from_list([{<<"x", (integer_to_binary(I))/binary>>, <<"text">>} || I <- lists:seq(1, 65)]),
    assert_refused(413, 1, <<"65 buffers">>, Json([Add#{<<"buffers">> => Lots}, Times])),
    %% A copy step stays one field alone.
    assert_refused(400, 2, <<"alone">>, Json([Add, #{<<"copy">> => [<<"c">>, 0, <<"d">>, 0, 4],
                                                   <<"outputs">> => #{<<"d">> => 4}}])).

%% request_max_output_bytes (here 3 * 4 KiB) bounds what the steps make,
%% counted to the word: the chain at exactly the budget runs, a word over
%% is 413 naming the step; a huge output size is refused before anything.
over_the_request_budget_is_413() ->
    {ok, Default} = application:get_env(kem, request_max_output_bytes),
    N = 1024, Budget = 3 * 4 * N,
    ok = application:set_env(kem, request_max_output_bytes, Budget),
    try
        A = random_words(N), B = random_words(N),
        Steps = steps(binary_to_list(from_words(A)), binary_to_list(from_words(B)), N, 5),
        %% a and b (8 KiB) and c (4 KiB): 12 KiB, then d's 4 KiB is over.
        assert_refused(413, 2, <<"over this request's limit of 12288">>, json(#{<<"steps">> => Steps})),
        %% Without d: c and d made by one step in place of two, exactly 12 KiB.
        [Add, _] = Steps,
        Sum = Add#{<<"outputs">> => #{<<"c">> => 4 * N}},
        ?assertEqual({ok, #{<<"c">> => expected(A, B, 1)}}, buffers(json(#{<<"steps">> => [Sum]}))),
        assert_refused(413, 1, <<"12292 bytes">>, json(#{<<"steps">> => [Sum#{<<"outputs">> => #{<<"c">> => 4 * N + 1}}]})),
        assert_refused(413, 1, <<"over this request's limit">>,
                       json(#{<<"steps">> => [Sum#{<<"outputs">> => #{<<"c">> => 1 bsl 40}}]}))
    after
        application:set_env(kem, request_max_output_bytes, Default)
    end.

%% kem_chain_budget bounds a step's workgroups by the request's words; the
%% port, given the request budget (max_bytes), bounds its invocations as a
%% call's: 1,000 workgroups of 64 passed before (64,000 invocations under a
%% 12 KiB budget, whose largest call launches 3,072), now a 400 naming them.
the_port_counts_a_steps_work_against_the_request_budget() ->
    {ok, Default} = application:get_env(kem, request_max_output_bytes),
    N = 1024,
    ok = application:set_env(kem, request_max_output_bytes, 3 * 4 * N),
    try
        A = random_words(N), B = random_words(N),
        [Add, _] = steps(binary_to_list(from_words(A)), binary_to_list(from_words(B)), N, 5),
        Wide = maps:remove(<<"grid">>, Add#{<<"workgroups">> => [1000, 1, 1]}),
        assert_refused(400, 1, <<"workgroups">>, json(#{<<"steps">> => [Wide]})),
        Fits = maps:remove(<<"grid">>, Add#{<<"workgroups">> => [N div 64, 1, 1]}),
        ?assertEqual({ok, #{<<"c">> => expected(A, B, 1)}}, buffers(json(#{<<"steps">> => [Fits]})))
    after
        application:set_env(kem, request_max_output_bytes, Default)
    end.

%% The rule kem_chain_budget counts by: a kem@1.0-shaped kernel given
%% `outputs' and no output-size still makes its binding-1 output, the size
%% of its input (the port answers it as the body), so that output is
%% counted; at exactly input + mark's bytes the chain runs, a word less
%% and it is refused.
kem_shaped_step_with_outputs_makes_binding_1() ->
    {ok, Default} = application:get_env(kem, request_max_output_bytes),
    try
        lists:foreach(
            fun(N) ->
                In = random_words(N),
                Body = #{<<"input-data">> => from_words(In),
                         <<"steps">> => [#{<<"kernel-id">> => <<"plus_mark">>, <<"outputs">> => #{<<"mark">> => 4 * N}}]},
                ok = application:set_env(kem, request_max_output_bytes, 8 * N),
                {ok, Reply} = message(Body),
                ?assertEqual(from_words([(X + 1) band 16#FFFFFFFF || X <- In]), maps:get(<<"body">>, Reply)),
                ok = application:set_env(kem, request_max_output_bytes, 8 * N - 4),
                assert_refused(413, 1, <<"over this request's limit">>, message(Body))
            end, sizes())
    after
        application:set_env(kem, request_max_output_bytes, Default)
    end.

%%% over HTTP: inets httpd plays the node

%% @private httpd's callback: the JSON body as HyperBEAM hands it to
%% dev_kem (Msg2's body); the reply's top-level binaries and integers as
%% headers written as is, each nested binary a multipart part named by
%% its path (HyperBEAM's httpsig codec, as dev_kem_run_tests plays it).
do(#mod{entity_body = Body}) ->
    {Status, Reply} = case dev_kem:execute_chain(#{}, #{<<"body">> => list_to_binary(Body)}, #{}) of
                          {ok, R} -> {200, R};
                          {error, R} -> {maps:get(<<"status">>, R), R}
                      end,
    Boundary = <<"kem-chain-boundary">>,
    {ReplyBody, Type} = case maps:find(<<"buffers">>, Reply) of
                            {ok, Nested} ->
                                {iolist_to_binary([[<<"--", Boundary/binary, "\r\ncontent-disposition: form-data;name=\"buffers/",
                                                      Name/binary, "/body\"\r\n\r\n">>, Bytes, <<"\r\n">>]
                                                   || {Name, #{<<"body">> := Bytes}} <- maps:to_list(Nested)]
                                                  ++ [<<"--", Boundary/binary, "--">>]),
                                 [{"content-type", "multipart/form-data; boundary=\"" ++ binary_to_list(Boundary) ++ "\""}]};
                            error -> {maps:get(<<"body">>, Reply, <<>>), []}
                        end,
    Hdrs = [{binary_to_list(K), case V of _ when is_integer(V) -> integer_to_list(V); _ -> binary_to_list(V) end}
            || {K, V} <- maps:to_list(Reply), not is_map(V), not lists:member(K, [<<"body">>, <<"status">>])] ++ Type,
    {proceed, [{response, {response, [{code, Status}, {content_length, integer_to_list(byte_size(ReplyBody))} | Hdrs],
                           binary_to_list(ReplyBody)}}]}.

named_chain_over_real_http() ->
    Dir = filename:join("/tmp", "dev_kem_chain_httpd_" ++ os:getpid()),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    {ok, Httpd} = inets:start(httpd, [{port, 0}, {bind_address, {127, 0, 0, 1}}, {server_name, "kem"},
                                      {server_root, Dir}, {document_root, Dir}, {modules, [?MODULE]}]),
    try
        [{port, Port}] = httpd:info(Httpd, [port]),
        Url = "http://127.0.0.1:" ++ integer_to_list(Port) ++ "/~kem@1.0/execute_chain",
        N = 500 + rand:uniform(500), K = 2 + rand:uniform(100),
        A = random_words(N), B = random_words(N),
        Post = fun(Steps) ->
                       httpc:request(post, {Url, [], "application/json",
                                            kem_json:encode(#{<<"steps">> => Steps})},
                                     [{timeout, 30000}], [{body_format, binary}])
               end,
        Steps = steps(binary_to_list(from_words(A)), binary_to_list(from_words(B)), N, K),
        {ok, {{_, 200, _}, Headers, Body}} = Post(Steps),
        ?assertEqual("add,times", proplists:get_value("kem-usage-kernel-id", Headers)),
        Want = expected(A, B, K),
        Part = <<"content-disposition: form-data;name=\"buffers/d/body\"\r\n\r\n", Want/binary, "\r\n">>,
        ?assertNotEqual(nomatch, binary:match(Body, Part)),
        %% A refusal over the same road: 400, JSON body naming step and field.
        [Add, Times] = Steps,
        {ok, {{_, 400, _}, _, BadBody}} = Post([Add, Times#{<<"constants">> => #{<<"factor">> => <<"x">>}}]),
        {ok, #{<<"details">> := D}} = kem_json:decode(BadBody),
        ?assertMatch(<<"step 2: constants", _/binary>>, D)
    after
        inets:stop(httpd, Httpd),
        file:del_dir_r(Dir)
    end.
