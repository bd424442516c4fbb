%%% @doc `grid', `workgroups' and `constants' on dev_kem's single calls
%%% (issue 25): `execute_kernel_with_params' runs a 2-D scaled transpose
%%% (@workgroup_size(8, 8), an override SCALE without a default) with a
%%% grid of its input's shape, against values computed here on fresh
%%% random integers (exact in f32), with every form HyperBEAM delivers the
%%% keys in (typed values, header text, a JSON body, multipart-style
%%% nested parts); `execute_kernel' takes an override-sized workgroup;
%%% bad values are 400s naming the key; one exchange over real HTTP (inets
%%% httpd plays the node: headers become message keys, as HyperBEAM's
%%% httpsig codec makes them).
-module(dev_kem_dispatch_tests).
-include_lib("eunit/include/eunit.hrl").
-include_lib("inets/include/httpd.hrl").

-export([do/1]).

-define(TRANSPOSE, <<"
override SCALE: f32;
struct Dims { rows: u32, cols: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> t: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    let row = gid.y;
    if (row >= dims.rows || col >= dims.cols) { return; }
    t[col * dims.rows + row] = a[row * dims.cols + col] * SCALE;
}
">>).

%% Each output pair: the input doubled and the workgroups dispatched, which
%% tells the override-sized workgroup the pipeline was built with.
-define(SIZED, <<"
override WG: u32 = 64;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<vec2<f32>>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&b)) { return; }
    b[i] = vec2<f32>(a[i] * 2.0, f32(nwg.x));
}
">>).

%% A host template called by named buffers: ALPHA without a default, an
%% override-sized workgroup, ys updated in place.
-define(SAXPY, <<"
override ALPHA: f32;
override WG: u32 = 64;
@group(0) @binding(0) var<storage, read> xs: array<f32>;
@group(0) @binding(1) var<storage, read_write> ys: array<f32>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&ys)) { ys[i] = ALPHA * xs[i] + ys[i]; }
}
">>).

-define(SHAPES, [{8, 8}, {5, 33}, {17, 3}, {1, 70}]).

dispatch_test_() ->
    {setup,
     fun() ->
             {ok, _} = application:ensure_all_started(inets),
             kem_test_app:start_with_kernels("dev_kem_dispatch", [{"transpose", ?TRANSPOSE}, {"sized", ?SIZED}, {"saxpy", ?SAXPY}], [])
     end,
     fun kem_test_app:stop_with_kernels/1,
     [{timeout, 120, fun typed_keys/0},
      {timeout, 60, fun header_text_and_an_octet_stream_body/0},
      {timeout, 60, fun a_json_body/0},
      {timeout, 60, fun workgroups_and_nested_parts/0},
      {timeout, 60, fun execute_kernel_takes_an_override_sized_workgroup/0},
      {timeout, 60, fun refusals_name_the_key/0},
      {timeout, 60, fun run_takes_a_grid_and_constants/0},
      {timeout, 60, fun hostile_values_are_400s_with_safe_headers/0},
      {timeout, 60, fun over_real_http/0}]}.

%%% references

ints(N) -> [rand:uniform(101) - 51 || _ <- lists:seq(1, N)].
floats(Xs) -> << <<X:32/float-little>> || X <- Xs >>.

transposed(A, R, C, Scale) ->
    At = list_to_tuple(A),
    floats([element(Row * C + Col + 1, At) * Scale || Col <- lists:seq(0, C - 1), Row <- lists:seq(0, R - 1)]).

params_text(R, C) -> iolist_to_binary(io_lib:format("~b,~b,0,0", [R, C])).

with_params(Req) -> dev_kem:execute_kernel_with_params(#{}, Req, #{}).

body({ok, #{<<"status">> := 200, <<"body">> := Body}}) -> {ok, Body};
body(Other) -> Other.

details(Reply) ->
    {ok, #{<<"details">> := D}} = kem_json:decode(maps:get(<<"body">>, Reply)),
    D.

%%% results

%% Values as HyperBEAM types them (Lua, ao-types): a list, a float.
typed_keys() ->
    [begin
         A = ints(R * C),
         Req = #{<<"kernel-id">> => <<"transpose">>, <<"input-data">> => floats(A), <<"params">> => params_text(R, C),
                 <<"grid">> => [C, R, 1], <<"constants">> => #{<<"SCALE">> => 2.5}},
         ?assertEqual({ok, transposed(A, R, C, 2.5)}, body(with_params(Req)), {R, C})
     end || {R, C} <- ?SHAPES].

%% Untyped header values: "X,Y,Z" and an HTTP structured-field
%% dictionary; the input as an octet-stream body.
header_text_and_an_octet_stream_body() ->
    [begin
         A = ints(R * C),
         Req = #{<<"kernel-id">> => <<"transpose">>, <<"body">> => floats(A),
                 <<"content-type">> => <<"application/octet-stream">>, <<"params">> => params_text(R, C),
                 <<"grid">> => iolist_to_binary(io_lib:format("~b, ~b, 1", [C, R])),
                 <<"constants">> => <<"SCALE=-0.5">>},
         ?assertEqual({ok, transposed(A, R, C, -0.5)}, body(with_params(Req)), {R, C})
     end || {R, C} <- ?SHAPES].

a_json_body() ->
    [begin
         A = ints(R * C),
         Json = kem_json:encode(#{<<"kernel_id">> => <<"transpose">>, <<"input_data">> => binary_to_list(floats(A)),
                                  <<"params">> => [R, C, 0, 0], <<"grid">> => [C, R, 1],
                                  <<"constants">> => #{<<"SCALE">> => 3}}),
         ?assertEqual({ok, transposed(A, R, C, 3)}, body(with_params(#{<<"body">> => Json})), {R, C})
     end || {R, C} <- ?SHAPES].

%% workgroups instead of a grid; constants as parts constants/SCALE (a
%% part with its own headers arrives as a message with a body), and the
%% normalised list form #{1 => X, ...}.
workgroups_and_nested_parts() ->
    [begin
         A = ints(R * C),
         Groups = #{<<"1">> => integer_to_binary((C + 7) div 8), <<"2">> => integer_to_binary((R + 7) div 8), <<"3">> => <<"1">>},
         Req = #{<<"kernel-id">> => <<"transpose">>, <<"input-data">> => floats(A), <<"params">> => params_text(R, C),
                 <<"workgroups">> => Groups, <<"constants">> => #{<<"SCALE">> => #{<<"body">> => <<"1e1">>}}},
         ?assertEqual({ok, transposed(A, R, C, 10)}, body(with_params(Req)), {R, C})
     end || {R, C} <- ?SHAPES].

%% execute_kernel with constants: WG sizes the workgroup, the 1-D rule
%% divides by it (the dispatched count comes back in every pair).
execute_kernel_takes_an_override_sized_workgroup() ->
    [begin
         A = ints(Count),
         Req = #{<<"kernel-id">> => <<"sized">>, <<"input-data">> => floats(A), <<"output-size-hint">> => <<"2">>},
         Groups = fun(W) -> (Count + W - 1) div W end,
         Pairs = fun(W) -> << <<(2 * X):32/float-little, (Groups(W)):32/float-little>> || X <- A >> end,
         ?assertEqual({ok, Pairs(64)}, body(dev_kem:execute_kernel(#{}, Req, #{}))),
         ?assertEqual({ok, Pairs(16)}, body(dev_kem:execute_kernel(#{}, Req#{<<"constants">> => <<"WG=16">>}, #{}))),
         ?assertEqual({ok, Pairs(8)}, body(dev_kem:execute_kernel(#{}, Req#{<<"constants">> => #{<<"WG">> => 8}}, #{})))
     end || Count <- [1, 64, 65, 1000]].

refusals_name_the_key() ->
    A = floats(ints(64)),
    Base = #{<<"kernel-id">> => <<"transpose">>, <<"input-data">> => A, <<"params">> => params_text(8, 8),
             <<"grid">> => [8, 8, 1], <<"constants">> => #{<<"SCALE">> => 1}},
    Refused = fun(Req, Word) ->
                  {error, Reply} = with_params(Req),
                  ?assertMatch(#{<<"status">> := 400}, Reply, Req),
                  ?assertNotEqual(nomatch, binary:match(details(Reply), Word), {Req, details(Reply)}),
                  Reply
              end,
    %% malformed dispatch, read here
    [Refused(Base#{<<"grid">> => G}, <<"grid">>)
     || G <- [[0, 1, 1], [1, 1], <<"a,b,c">>, <<"1,2">>, [1.5, 1, 1], #{<<"x">> => 1}, [-1, 1, 1],
              [<<"99999999999999999999999">>, 1, 1], 7]],
    Refused(Base#{<<"workgroups">> => [1, 1, 1]}, <<"not both">>),
    %% more invocations than 4-byte elements of the input and output
    Refused(Base#{<<"grid">> => [65535, 65535, 64]}, <<"at most 128">>),
    Refused(maps:remove(<<"grid">>, Base#{<<"workgroups">> => [65535, 65535, 64]}), <<"at most 128">>),
    %% malformed constants, read here
    [Refused(Base#{<<"constants">> => C}, Word)
     || {C, Word} <- [{#{<<"SCALE">> => <<"abc">>}, <<"SCALE">>}, {#{<<"SCALE">> => <<"inf">>}, <<"SCALE">>},
                      {#{<<"SCALE">> => <<"1e999">>}, <<"SCALE">>}, {#{<<"SCALE">> => [1]}, <<"SCALE">>},
                      {#{<<"1x">> => 1}, <<"1x">>}, {<<"SCALE">>, <<"SCALE">>}, {<<"SCALE=1, SCALE=2">>, <<"twice">>},
                      {[1, 2], <<"constants">>},
                      {maps:from_list([{<<"c", (integer_to_binary(I))/binary>>, I} || I <- lists:seq(1, 65)]), <<"64">>}]],
    %% what only the kernel tells: the port's bad_args, naming the override
    Refused(maps:remove(<<"constants">>, Base), <<"SCALE">>),
    Refused(Base#{<<"constants">> => #{<<"SCALE">> => 1, <<"SCALF">> => 2}}, <<"SCALF">>),
    %% a 2-D workgroup with no grid: the 1-D rule cannot be right
    {error, NoGrid} = with_params(maps:remove(<<"grid">>, Base)),
    ?assertNotEqual(nomatch, binary:match(details(NoGrid), <<"grid">>), details(NoGrid)),
    %% and the port still answers
    ?assertMatch({ok, _}, body(with_params(Base))).

%% The run key: a grid instead of workgroups, constants as a header
%% dictionary and as typed values.
run_takes_a_grid_and_constants() ->
    [begin
         Xs = ints(N), Ys = ints(N),
         Req = #{<<"kernel-id">> => <<"saxpy">>, <<"buffers">> => #{<<"xs">> => floats(Xs), <<"ys">> => floats(Ys)},
                 <<"grid">> => <<(integer_to_binary(N))/binary, ",1,1">>, <<"constants">> => Constants},
         {ok, #{<<"status">> := 200, <<"buffers">> := #{<<"ys">> := #{<<"body">> := Got}}}} = dev_kem:run(#{}, Req, #{}),
         ?assertEqual(floats([Alpha * X + Y || {X, Y} <- lists:zip(Xs, Ys)]), Got, {N, Constants})
     end || N <- [1, 63, 1000], {Constants, Alpha} <- [{<<"ALPHA=2, WG=32">>, 2}, {#{<<"ALPHA">> => -1.5}, -1.5}]],
    %% neither grid nor workgroups; both; a missing override
    Base = #{<<"kernel-id">> => <<"saxpy">>, <<"buffers">> => #{<<"xs">> => <<0:128>>, <<"ys">> => <<0:128>>},
             <<"constants">> => <<"ALPHA=1">>},
    [begin
         {error, Reply} = dev_kem:run(#{}, Req, #{}),
         ?assertMatch(#{<<"status">> := 400}, Reply),
         ?assertNotEqual(nomatch, binary:match(details(Reply), Word), details(Reply))
     end || {Req, Word} <- [{Base, <<"grid">>}, {Base#{<<"grid">> => [4, 1, 1], <<"workgroups">> => [1, 1, 1]}, <<"not both">>},
                            {Base#{<<"grid">> => [4, 1, 1], <<"constants">> => #{}}, <<"ALPHA">>},
                            {Base#{<<"grid">> => [4, 1, 1], <<"constants">> => <<"ALPHA=x">>}, <<"ALPHA">>}]].

%% What a stranger can put in the three keys: each a 400 whose top-level
%% values are kem's own short ASCII (HTTP headers), the details in the JSON
%% body, answered at once (a megabyte of digits is not parsed).
hostile_values_are_400s_with_safe_headers() ->
    Base = #{<<"kernel-id">> => <<"transpose">>, <<"input-data">> => floats(ints(64)), <<"params">> => params_text(8, 8),
             <<"grid">> => [8, 8, 1], <<"constants">> => #{<<"SCALE">> => 1}},
    Evil = <<"\r\nSet-Cookie: pwned=1\r\n", 16#C3, 16#A9, 0>>,
    Mega = binary:copy(<<"9">>, 1 bsl 20),
    Shapes = [{<<"grid">>, Mega}, {<<"grid">>, <<Mega/binary, ",1,1">>}, {<<"grid">>, [Mega, 1, 1]}, {<<"grid">>, Evil},
              {<<"grid">>, #{<<"1">> => #{<<"a">> => 1}, <<"2">> => 1, <<"3">> => 1}}, {<<"grid">>, [[1], 1, 1]},
              {<<"workgroups">>, binary:copy(<<"1,">>, 100000)},
              {<<"constants">>, Mega}, {<<"constants">>, binary:copy(<<"S=1,">>, 100000)},
              {<<"constants">>, #{<<"SCALE">> => Mega}}, {<<"constants">>, #{Evil => 1}},
              {<<"constants">>, #{<<"SCALE">> => Evil}}, {<<"constants">>, <<Evil/binary, "=1">>},
              {<<"constants">>, #{<<"SCALE">> => #{<<"body">> => #{<<"body">> => <<"1">>}}}},
              {<<"constants">>, #{binary:copy(<<"A">>, 200) => 1}}],
    [begin
         Started = erlang:monotonic_time(millisecond),
         {error, Reply} = with_params(Base#{Key => Value}),
         ?assert(erlang:monotonic_time(millisecond) - Started < 1000, Key),
         ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"bad_args">>}, Reply, Key),
         [?assert(is_integer(V) orelse printable(V), {Key, K, V}) || {K, V} <- maps:to_list(maps:remove(<<"body">>, Reply))],
         ?assertEqual(nomatch, binary:match(details(Reply), <<"\r\n">>), Key)
     end || {Key, Value} <- Shapes],
    %% the port still answers
    ?assertMatch({ok, _}, body(with_params(Base))).

printable(V) when is_binary(V), byte_size(V) =< 256 -> lists:all(fun(C) -> C >= 16#20 andalso C =< 16#7E end, binary_to_list(V));
printable(_) -> false.

%%% over HTTP: inets httpd plays the node

%% @private httpd's callback, as HyperBEAM's httpsig codec reads a
%% request: every header a message key (lowercase), the body `body'; the
%% path's last part names the device key. The reply as kem_isolation_tests
%% sends it: `status' the status line, other top-level keys headers.
do(#mod{request_uri = Uri, parsed_header = Headers, entity_body = Body}) ->
    Key = lists:last(string:split(Uri, "/", all)),
    Msg = maps:from_list([{list_to_binary(K), list_to_binary(V)} || {K, V} <- Headers]),
    Req = Msg#{<<"body">> => list_to_binary(Body)},
    Result = case Key of
                 "execute_kernel" -> dev_kem:execute_kernel(#{}, Req, #{});
                 "execute_kernel_with_params" -> dev_kem:execute_kernel_with_params(#{}, Req, #{})
             end,
    {Status, Reply} = case Result of
                          {ok, R} -> {maps:get(<<"status">>, R, 200), R};
                          {error, R} -> {maps:get(<<"status">>, R, 500), R}
                      end,
    Out = maps:get(<<"body">>, Reply, <<>>),
    Hdrs = [{binary_to_list(K), header_text(V)} || {K, V} <- maps:to_list(Reply),
                                                    K =/= <<"body">>, K =/= <<"status">>],
    {proceed, [{response, {response, [{code, Status}, {content_length, integer_to_list(byte_size(Out))} | Hdrs],
                           binary_to_list(Out)}}]}.

header_text(V) when is_integer(V) -> integer_to_list(V);
header_text(V) when is_binary(V) -> binary_to_list(V).

over_real_http() ->
    Dir = filename:join("/tmp", "dev_kem_dispatch_httpd_" ++ os:getpid()),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    {ok, Httpd} = inets:start(httpd, [{port, 0}, {bind_address, {127, 0, 0, 1}}, {server_name, "kem"},
                                      {server_root, Dir}, {document_root, Dir}, {modules, [?MODULE]}]),
    try
        [{port, Port}] = httpd:info(Httpd, [port]),
        Url = "http://127.0.0.1:" ++ integer_to_list(Port) ++ "/~kem@1.0/execute_kernel_with_params",
        Post = fun(Headers, Input) ->
                   httpc:request(post, {Url, Headers, "application/octet-stream", Input},
                                 [{timeout, 30000}], [{body_format, binary}])
               end,
        [begin
             A = ints(R * C),
             Headers = [{"kernel-id", "transpose"}, {"params", binary_to_list(params_text(R, C))},
                        {"grid", lists:flatten(io_lib:format("~b,~b,1", [C, R]))}, {"constants", "SCALE=0.25"}],
             {ok, {{_, 200, _}, _, Got}} = Post(Headers, floats(A)),
             ?assertEqual(transposed(A, R, C, 0.25), Got, {R, C})
         end || {R, C} <- ?SHAPES],
        %% A refusal over the same road: 400, the key named in the JSON body.
        {ok, {{_, 400, _}, _, BadBody}} = Post([{"kernel-id", "transpose"}, {"params", "8,8,0,0"},
                                                {"grid", "8,8,1"}, {"constants", "SCALE=abc"}], floats(ints(64))),
        {ok, #{<<"details">> := D}} = kem_json:decode(BadBody),
        ?assertNotEqual(nomatch, binary:match(D, <<"SCALE">>))
    after
        inets:stop(httpd, Httpd),
        file:del_dir_r(Dir)
    end.

%%% dev_kem_opts alone: the forms of a number

number_forms_test() ->
    Read = fun(V) -> dev_kem_opts:dispatch(#{constants => #{<<"S">> => V}}, #{}, #{}) end,
    [?assertEqual({ok, #{constants => #{<<"S">> => Want}}}, Read(Text), Text)
     || {Text, Want} <- [{<<"16">>, 16}, {<<" -3 ">>, -3}, {<<"2.5">>, 2.5}, {<<".5">>, 0.5}, {<<"5.">>, 5.0},
                         {<<"1e3">>, 1.0e3}, {<<"-1.5E-2">>, -1.5e-2}, {<<"-0.0">>, -0.0}, {7, 7}, {1.25, 1.25}]],
    [?assertMatch({error, _}, Read(Text), Text)
     || Text <- [<<>>, <<".">>, <<"e3">>, <<"1e">>, <<"0x10">>, <<"nan">>, <<"inf">>, <<"1,5">>, <<"1e99999">>,
                 binary:copy(<<"1">>, 65), true, <<"1 2">>]].
