%%% @doc eunit tests of `dev_kem:run/3' (a kernel by named buffers through
%%% the HyperBEAM device, issue 25) on the real Python port, against Erlang
%%% references on fresh random data: two inputs and an output, an in-place
%%% buffer with a uniform and an output in a second group, sizes as typed
%%% integers and as decimal binaries, refusals (400 naming the buffer, 413
%%% over the request budget), no untrusted byte at the top level, and one
%%% exchange over real HTTP (inets httpd plays the node, as
%%% kem_isolation_tests does).
-module(dev_kem_run_tests).
-include_lib("eunit/include/eunit.hrl").
-include_lib("inets/include/httpd.hrl").

-export([do/1]).

-include("kem_named_kernels.hrl").
-define(MAX_HEADER, 256).
%% What a kernel's output may hold: a header injection if it were a header.
-define(HOSTILE_BYTES, <<"\r\nSet-Cookie: pwned=1\r\n\r\n<html>", 16#E2, 16#80, 16#A8, 0>>).

run_test_() ->
    {setup,
     fun() ->
             {ok, _} = application:ensure_all_started(inets),
             kem_test_app:start_with_kernels("dev_kem_run", [{"add", ?ADD}, {"scale", ?SCALE}], [])
     end,
     fun kem_test_app:stop_with_kernels/1,
     [{timeout, 60, fun two_inputs_one_output/0},
      {timeout, 60, fun in_place_with_a_uniform_and_a_second_group/0},
      {timeout, 60, fun sizes_as_decimal_binaries_and_nested_groups/0},
      {timeout, 60, fun missing_output_size_names_the_buffer/0},
      {timeout, 60, fun bad_workgroups_are_refused/0},
      {timeout, 60, fun bad_buffers_and_sizes_are_refused/0},
      {timeout, 60, fun over_the_request_budget_is_413/0},
      {timeout, 60, fun no_untrusted_byte_at_the_top_level/0},
      {timeout, 60, fun named_buffers_over_real_http/0}]}.

words(Bin) -> [W || <<W:32/little>> <= Bin].
from_words(Ws) -> << <<W:32/little>> || W <- Ws >>.
random_words(N) -> [rand:uniform(1 bsl 30) || _ <- lists:seq(1, N)].

run(Req) -> dev_kem:run(#{}, Req, #{}).

%% A success's buffers, name => bytes.
buffers({ok, #{<<"status">> := 200, <<"buffers">> := Nested}}) ->
    {ok, maps:map(fun(_, #{<<"body">> := B}) -> B end, Nested)};
buffers(Other) -> Other.

details(Reply) ->
    {ok, #{<<"details">> := D}} = kem_json:decode(maps:get(<<"body">>, Reply)),
    D.

%% Every top-level value but the nested buffers: a status number, or a
%% short line of printable ASCII.
assert_safe_top_level(Reply) ->
    [?assert(is_integer(V) orelse safe_header(V), {K, V})
     || {K, V} <- maps:to_list(maps:without([<<"body">>, <<"buffers">>], Reply))],
    ?assertNot(maps:is_key(<<"set-cookie">>, Reply)).

safe_header(V) when is_binary(V), byte_size(V) =< ?MAX_HEADER ->
    lists:all(fun(C) -> C >= 16#20 andalso C =< 16#7E end, binary_to_list(V));
safe_header(_) -> false.

add_request(A, B, Outputs, Groups) ->
    #{<<"kernel-id">> => <<"add">>, <<"buffers">> => #{<<"a">> => A, <<"b">> => B},
      <<"outputs">> => Outputs, <<"workgroups">> => Groups}.

%%% results

two_inputs_one_output() ->
    lists:foreach(
        fun(N) ->
            A = random_words(N), B = random_words(N),
            {ok, Reply} = run(add_request(from_words(A), from_words(B), #{<<"c">> => 4 * N},
                                          [(N + 63) div 64, 1, 1])),
            ?assertEqual({ok, #{<<"c">> => from_words([X + Y || {X, Y} <- lists:zip(A, B)])}}, buffers({ok, Reply})),
            %% Usage as execute_kernel's, counted over every buffer.
            ?assertMatch(#{<<"kem-usage-kernel-id">> := <<"add">>, <<"kem-usage-clock">> := _,
                           <<"kem-usage-us">> := Us} when is_integer(Us), Reply),
            ?assertEqual(8 * N, maps:get(<<"kem-usage-bytes-in">>, Reply)),
            ?assertEqual(4 * N, maps:get(<<"kem-usage-bytes-out">>, Reply)),
            assert_safe_top_level(Reply)
        end, [1, 64, 1000 + rand:uniform(1000)]).

%% snake_case names, workgroups as a Lua array becomes one in HyperBEAM
%% (keys 1..3), the in-place buffer returned changed, the output in group
%% 1 by "G/B".
in_place_with_a_uniform_and_a_second_group() ->
    N = 100 + rand:uniform(200),
    V = random_words(N),
    Req = #{<<"kernel_id">> => <<"scale">>, <<"entry_point">> => <<"main">>,
            <<"buffers">> => #{<<"params">> => <<3:32/little, N:32/little>>, <<"values">> => from_words(V)},
            <<"outputs">> => #{<<"1/2">> => 4 * N},
            <<"workgroups">> => #{<<"1">> => (N + 31) div 32, <<"2">> => 1, <<"3">> => 1}},
    {ok, Out} = buffers(run(Req)),
    Scaled = [(X * 3) band 16#FFFFFFFF || X <- V],
    ?assertEqual(lists:sort([<<"values">>, <<"doubled">>]), lists:sort(maps:keys(Out))),
    ?assertEqual(Scaled, words(maps:get(<<"values">>, Out))),
    ?assertEqual([(X * 2) band 16#FFFFFFFF || X <- Scaled], words(maps:get(<<"doubled">>, Out))).

%% HyperBEAM delivers an untyped size as its digits and a `buffers/1/2'
%% part nested by group; a buffer may come as a part with its own headers
%% (#{content-type, body}); workgroups as a header "X,Y,Z".
sizes_as_decimal_binaries_and_nested_groups() ->
    N = 500 + rand:uniform(500),
    A = random_words(N), B = random_words(N),
    Groups = integer_to_binary((N + 63) div 64),
    Req = add_request(#{<<"content-type">> => <<"application/octet-stream">>, <<"body">> => from_words(A)},
                      from_words(B), #{<<"c">> => <<" ", (integer_to_binary(4 * N))/binary, " ">>},
                      <<Groups/binary, ", 1 ,1">>),
    ?assertEqual({ok, #{<<"c">> => from_words([X + Y || {X, Y} <- lists:zip(A, B)])}}, buffers(run(Req))),
    V = random_words(N),
    Nested = #{<<"kernel-id">> => <<"scale">>,
               <<"buffers">> => #{<<"0">> => #{<<"0">> => <<5:32/little, N:32/little>>, <<"1">> => from_words(V)}},
               <<"outputs">> => #{<<"1">> => #{<<"2">> => integer_to_binary(4 * N)}},
               <<"workgroups">> => [integer_to_binary((N + 31) div 32), <<"1">>, 1]},
    {ok, Out} = buffers(run(Nested)),
    ?assertEqual([(X * 10) band 16#FFFFFFFF || X <- V], words(maps:get(<<"doubled">>, Out))).

%%% refusals

missing_output_size_names_the_buffer() ->
    Four = <<0:32>>,
    {error, Reply} = run(add_request(Four, Four, #{}, [1, 1, 1])),
    ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"bad_args">>}, Reply),
    ?assertNotEqual(nomatch, binary:match(details(Reply), <<"output 'c'">>)),
    {error, NoInput} = run(#{<<"kernel-id">> => <<"add">>, <<"buffers">> => #{<<"a">> => Four},
                             <<"outputs">> => #{<<"c">> => 4}, <<"workgroups">> => [1, 1, 1]}),
    ?assertMatch(#{<<"status">> := 400}, NoInput),
    ?assertNotEqual(nomatch, binary:match(details(NoInput), <<"input 'b'">>)),
    assert_safe_top_level(Reply).

bad_workgroups_are_refused() ->
    Four = <<0:32>>,
    Cases = [missing, [0, 1, 1], [1, 1], <<"a,b,c">>, <<"1,2">>, [1.5, 1, 1], #{<<"x">> => 1}, [-1, 1, 1],
             [<<"99999999999999999999999">>, 1, 1]],
    lists:foreach(
        fun(Groups) ->
            Req = add_request(Four, Four, #{<<"c">> => 4}, Groups),
            {error, Reply} = run(case Groups of missing -> maps:remove(<<"workgroups">>, Req); _ -> Req end),
            ?assertMatch(#{<<"status">> := 400}, Reply, Groups),
            ?assertNotEqual(nomatch, binary:match(details(Reply), <<"workgroups">>), Groups)
        end, Cases),
    %% More workgroups than 4-byte elements of all the buffers: bad_args.
    {error, Many} = run(add_request(Four, Four, #{<<"c">> => 4}, [65535, 65535, 64])),
    ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"bad_args">>}, Many).

bad_buffers_and_sizes_are_refused() ->
    Four = <<0:32>>,
    Sizes = [-1, 1.5, <<"12a">>, <<"-4">>, <<>>, [4], #{<<"x">> => 1}],
    [begin
         {error, Reply} = run(add_request(Four, Four, #{<<"c">> => S}, [1, 1, 1])),
         ?assertMatch(#{<<"status">> := 400}, Reply, S),
         ?assertNotEqual(nomatch, binary:match(details(Reply), <<"output 'c'">>), S)
     end || S <- Sizes],
    %% A JSON-style array of byte values is not bytes.
    {error, Ints} = run(add_request([0, 0, 0, 0], Four, #{<<"c">> => 4}, [1, 1, 1])),
    ?assertMatch(#{<<"status">> := 400}, Ints),
    ?assertNotEqual(nomatch, binary:match(details(Ints), <<"buffer 'a'">>)),
    {error, NotMsg} = run((add_request(Four, Four, #{<<"c">> => 4}, [1, 1, 1]))#{<<"buffers">> => <<"x">>}),
    ?assertMatch(#{<<"status">> := 400}, NotMsg),
    {error, NoId} = run(maps:remove(<<"kernel-id">>, add_request(Four, Four, #{<<"c">> => 4}, [1, 1, 1]))),
    ?assertEqual(<<"kernel-id is required">>, details(NoId)),
    {error, Both} = run((add_request(Four, Four, #{<<"c">> => 4}, [1, 1, 1]))#{<<"kernel_id">> => <<"add">>}),
    ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"bad_args">>}, Both),
    {error, Unknown} = run((add_request(Four, Four, #{<<"c">> => 4}, [1, 1, 1]))#{<<"kernel-id">> => <<"nope">>}),
    ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"kernel_not_found">>}, Unknown).

%% request_max_output_bytes (here 1 KiB) bounds the given bytes and the
%% outputs, each; 65 buffers are over the port's 64, flat or in a group.
over_the_request_budget_is_413() ->
    {ok, Default} = application:get_env(kem, request_max_output_bytes),
    ok = application:set_env(kem, request_max_output_bytes, 1024),
    try
        Big = <<0:(2048 * 8)>>, Four = <<0:32>>,
        {error, In} = run(add_request(Big, Four, #{<<"c">> => 4}, [1, 1, 1])),
        ?assertMatch(#{<<"status">> := 413, <<"reason">> := <<"too_large">>}, In),
        {error, Out} = run(add_request(Four, Four, #{<<"c">> => <<"2048">>}, [1, 1, 1])),
        ?assertMatch(#{<<"status">> := 413, <<"reason">> := <<"too_large">>}, Out),
        Many = maps:from_list([{integer_to_binary(I), Four} || I <- lists:seq(1, 65)]),
        {error, Count} = run((add_request(Four, Four, #{<<"c">> => 4}, [1, 1, 1]))#{<<"buffers">> => Many}),
        ?assertMatch(#{<<"status">> := 413, <<"reason">> := <<"too_large">>}, Count),
        %% The same 65 nested in one bind group's message (buffers/0/N).
        {error, Nested} = run((add_request(Four, Four, #{<<"c">> => 4}, [1, 1, 1]))#{<<"buffers">> => #{<<"0">> => Many}}),
        ?assertMatch(#{<<"status">> := 413, <<"reason">> := <<"too_large">>}, Nested),
        %% Within it: runs.
        W = random_words(128),
        ?assertEqual({ok, #{<<"c">> => from_words([2 * X || X <- W])}},
                     buffers(run(add_request(from_words(W), from_words(W), #{<<"c">> => 512}, [2, 1, 1]))))
    after
        application:set_env(kem, request_max_output_bytes, Default)
    end.

%% A kernel's output that would be a header injection as a header: only
%% in the nested buffers, never a top-level value; the same for a
%% refusal quoting a hostile name.
no_untrusted_byte_at_the_top_level() ->
    Pad = (4 - byte_size(?HOSTILE_BYTES) rem 4) rem 4,
    Hostile = <<?HOSTILE_BYTES/binary, 0:(Pad * 8)>>,
    Zero = <<0:(byte_size(Hostile) * 8)>>,
    {ok, Reply} = run(add_request(Hostile, Zero, #{<<"c">> => byte_size(Hostile)}, [1, 1, 1])),
    ?assertEqual({ok, #{<<"c">> => Hostile}}, buffers({ok, Reply})),
    assert_safe_top_level(Reply),
    ?assertEqual(lists:sort([<<"buffers">>, <<"status">>, <<"kem-usage-kernel-id">>, <<"kem-usage-node">>,
                             <<"kem-usage-bytes-in">>, <<"kem-usage-bytes-out">>, <<"kem-usage-us">>,
                             <<"kem-usage-clock">>, <<"kem-usage-gas">>]),  % gas: an integer, docs/metering.md
                 lists:sort(maps:keys(Reply))),
    Name = <<"x\r\nSet-Cookie: a=1">>,
    {error, Bad} = run(add_request(Zero, Zero, #{Name => 4}, [1, 1, 1])),
    ?assertMatch(#{<<"status">> := 400}, Bad),
    assert_safe_top_level(Bad),
    {error, BadId} = run((add_request(Zero, Zero, #{<<"c">> => 4}, [1, 1, 1]))#{<<"kernel-id">> => Name}),
    assert_safe_top_level(BadId).

%%% over HTTP: inets httpd plays the node

%% @private httpd's callback, HyperBEAM's two codec steps as they apply to
%% this request (dev_codec_httpsig_conv): a multipart/form-data part named
%% `a/b' becomes the nested key a => b; the reply's top-level binaries and
%% integers are headers written as is (no escaping, as cowboy), each nested
%% binary a part named by its path.
do(#mod{parsed_header = Headers, entity_body = Body}) ->
    Type = proplists:get_value("content-type", Headers, ""),
    {match, [Boundary]} = re:run(Type, "boundary=\"?([^\";]+)", [{capture, all_but_first, binary}]),
    Msg = lists:foldl(fun({Path, Value}, Acc) -> put_path(binary:split(Path, <<"/">>, [global]), Value, Acc) end,
                      #{}, parts(list_to_binary(Body), Boundary)),
    {Status, Reply} = case dev_kem:run(#{}, Msg, #{}) of
                          {ok, R} -> {maps:get(<<"status">>, R, 200), R};
                          {error, R} -> {maps:get(<<"status">>, R, 500), R}
                      end,
    {Top, Nested} = lists:partition(fun({_, V}) -> not is_map(V) end, maps:to_list(maps:remove(<<"status">>, Reply))),
    {ReplyBody, Extra} = case flat(maps:from_list(Nested), <<>>) of
                             [] -> {maps:get(<<"body">>, Reply, <<>>), []};
                             Leaves ->
                                 B = <<"kem-test-boundary">>,
                                 {multipart(Leaves, B), [{"content-type", "multipart/form-data; boundary=\"" ++ binary_to_list(B) ++ "\""}]}
                         end,
    Hdrs = [{binary_to_list(K), header_text(V)} || {K, V} <- Top, K =/= <<"body">>] ++ Extra,
    {proceed, [{response, {response, [{code, Status}, {content_length, integer_to_list(byte_size(ReplyBody))}
                                      | Hdrs], binary_to_list(ReplyBody)}}]}.

header_text(V) when is_integer(V) -> integer_to_list(V);
header_text(V) when is_binary(V) -> binary_to_list(V).

put_path([Key], Value, Msg) -> Msg#{Key => Value};
put_path([Key | Rest], Value, Msg) -> Msg#{Key => put_path(Rest, Value, maps:get(Key, Msg, #{}))}.

flat(Map, Prefix) ->
    lists:append([case V of
                      _ when is_map(V) -> flat(V, <<Prefix/binary, K/binary, "/">>);
                      _ -> [{<<Prefix/binary, K/binary>>, V}]
                  end || {K, V} <- maps:to_list(Map)]).

multipart(Parts, Boundary) ->
    iolist_to_binary([[<<"--", Boundary/binary, "\r\ncontent-disposition: form-data;name=\"", Name/binary, "\"\r\n\r\n">>,
                       Value, <<"\r\n">>] || {Name, Value} <- Parts] ++ [<<"--", Boundary/binary, "--">>]).

%% A multipart body's parts as {Name, Bytes}: the name from each part's
%% content-disposition, the bytes after its blank line.
parts(Body, Boundary) ->
    [_ | Chunks] = binary:split(Body, <<"--", Boundary/binary>>, [global]),
    [begin
         <<"\r\n", Part/binary>> = Chunk,
         [Head, Rest] = binary:split(Part, <<"\r\n\r\n">>),
         {match, [Name]} = re:run(Head, "name=\"([^\"]+)\"", [{capture, all_but_first, binary}]),
         {Name, binary:part(Rest, 0, byte_size(Rest) - 2)}
     end || Chunk <- Chunks, not lists:member(Chunk, [<<"--">>, <<"--\r\n">>])].

named_buffers_over_real_http() ->
    Dir = filename:join("/tmp", "dev_kem_run_httpd_" ++ os:getpid()),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    {ok, Httpd} = inets:start(httpd, [{port, 0}, {bind_address, {127, 0, 0, 1}}, {server_name, "kem"},
                                      {server_root, Dir}, {document_root, Dir}, {modules, [?MODULE]}]),
    try
        [{port, Port}] = httpd:info(Httpd, [port]),
        Url = "http://127.0.0.1:" ++ integer_to_list(Port) ++ "/~kem@1.0/run",
        N = 1000 + rand:uniform(1000),
        Pad = (4 - byte_size(?HOSTILE_BYTES) rem 4) rem 4,
        %% The output begins with the hostile bytes: a header injection if
        %% any of it were a header.
        A = <<?HOSTILE_BYTES/binary, 0:(Pad * 8), (from_words(random_words(N)))/binary>>,
        B = <<0:(byte_size(?HOSTILE_BYTES) + Pad)/unit:8, (from_words(random_words(N)))/binary>>,
        Size = byte_size(A),
        Fields = [{<<"kernel-id">>, <<"add">>}, {<<"buffers/a">>, A}, {<<"buffers/b">>, B},
                  {<<"outputs/c">>, integer_to_binary(Size)},
                  {<<"workgroups">>, <<(integer_to_binary((Size div 4 + 63) div 64))/binary, ",1,1">>}],
        Boundary = <<"client-boundary-", (integer_to_binary(rand:uniform(1 bsl 40)))/binary>>,
        Result = httpc:request(post, {Url, [], "multipart/form-data; boundary=" ++ binary_to_list(Boundary),
                                      multipart(Fields, Boundary)},
                               [{timeout, 30000}], [{body_format, binary}]),
        ?assertMatch({ok, {{_, 200, _}, _, _}}, Result),
        {ok, {_, Headers, Body}} = Result,
        ?assertEqual([], [H || {K, _} = H <- Headers, string:lowercase(K) =:= "set-cookie"]),
        ?assertEqual("add", proplists:get_value("kem-usage-kernel-id", Headers)),
        {match, [RB]} = re:run(proplists:get_value("content-type", Headers), "boundary=\"?([^\";]+)",
                               [{capture, all_but_first, binary}]),
        Want = from_words([(X + Y) band 16#FFFFFFFF || {X, Y} <- lists:zip(words(A), words(B))]),
        ?assertEqual([{<<"buffers/c/body">>, Want}], parts(Body, RB)),
        ?assertEqual(?HOSTILE_BYTES, binary:part(Want, 0, byte_size(?HOSTILE_BYTES))),
        %% A refusal over the same road: 400, JSON body, the name in it.
        Bad = httpc:request(post, {Url, [], "multipart/form-data; boundary=" ++ binary_to_list(Boundary),
                                   multipart(lists:keydelete(<<"outputs/c">>, 1, Fields), Boundary)},
                            [{timeout, 30000}], [{body_format, binary}]),
        ?assertMatch({ok, {{_, 400, _}, _, _}}, Bad),
        {ok, {_, _, BadBody}} = Bad,
        {ok, #{<<"details">> := D}} = kem_json:decode(BadBody),
        ?assertNotEqual(nomatch, binary:match(D, <<"output 'c'">>))
    after
        inets:stop(httpd, Httpd),
        file:del_dir_r(Dir)
    end.
