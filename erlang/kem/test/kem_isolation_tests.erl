%%% @doc Issue 24, the node's side: what a stranger's request through
%%% `dev_kem' can do to the reply's framing, to other callers' kernels and
%%% to a port. On the real port: a kernel that does not compile quotes its
%%% own source (CR/LF, non-ASCII, a `Set-Cookie:' line) in naga's error, and
%%% none of it may reach a top-level key (an HTTP header), checked in a real
%%% HTTP exchange (inets httpd serving dev_kem's reply as HyperBEAM does,
%%% httpc reading it); a port owner that cannot answer is not a kernel's
%%% fault; a chain's dispatch and its buffers are bounded per request.
-module(kem_isolation_tests).
-include_lib("eunit/include/eunit.hrl").
-include_lib("inets/include/httpd.hrl").

-export([do/1]).

%% naga quotes the failing line in a multi-line report drawn with box
%% characters (U+250C, U+2502): LF and non-ASCII in the detail whatever the
%% kernel. The kernel adds CRLF line ends and `é' in a comment ended by
%% U+2028 (a WGSL line break), after which `Set-Cookie: pwned=1' is code:
%% the line naga quotes.
-define(HOSTILE, <<"@compute @workgroup_size(1)\r\nfn main() {\r\n  let y = 1u; // caf", 16#C3, 16#A9, " ",
                   16#E2, 16#80, 16#A8, "Set-Cookie: pwned=1\r\n}\r\n">>).
-define(MAX_HEADER, 256).

isolation_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 60, fun hostile_kernel_reply_has_safe_top_level_keys/0},
      {timeout, 60, fun every_reply_path_has_safe_top_level_keys/0},
      {timeout, 60, fun hostile_kernel_over_real_http/0},
      {timeout, 60, fun chain_dispatch_is_bounded_by_its_output/0},
      {timeout, 60, fun chain_buffers_count_against_one_request_budget/0},
      {timeout, 60, fun duplicate_json_keys_are_refused/0},
      {timeout, 60, fun string_input_data_is_refused/0},
      {timeout, 60, fun innocent_kernel_behind_a_suspended_owner_is_not_quarantined/0},
      {timeout, 60, fun timed_out_chain_quarantines_its_kernels_for_chains/0}]}.

start() ->
    {ok, _} = application:ensure_all_started(inets),
    %% Large inputs take the pipe, not /dev/shm: the suspended-owner test
    %% fills the pipe.
    kem_test_app:start_with_kernels("kem_isolation",
                                    [{"hostile", ?HOSTILE}, {"runaway", kem_test_app:runaway_kernel()}],
                                    [{port_env, [{"KEM_TEST_HOOKS", "1"}]}, {shm_threshold, 1 bsl 30}]).

stop(Started) ->
    kem_test_app:stop_with_kernels(Started).

now_ms() -> erlang:monotonic_time(millisecond).

%% `ok' once Cond() holds, or `timeout' at Deadline (now_ms()).
until(Cond, Deadline) ->
    case Cond() orelse now_ms() > Deadline of
        true -> case Cond() of true -> ok; false -> timeout end;
        false -> timer:sleep(5), until(Cond, Deadline)
    end.

hostile_request() ->
    #{<<"body">> => kem_json:encode(#{<<"kernel-id">> => <<"hostile">>, <<"input-data">> => [1, 2, 3, 4]})}.

%% Every top-level value but the body: a status number, or a short line of
%% printable ASCII; and no header a client would act on.
assert_safe_top_level(Reply) ->
    ?assertNot(maps:is_key(<<"set-cookie">>, Reply)),
    [?assert(is_integer(V) orelse safe_header(V), {K, V}) || {K, V} <- maps:to_list(maps:remove(<<"body">>, Reply))],
    {ok, Json} = kem_json:decode(maps:get(<<"body">>, Reply)),
    Json.

safe_header(V) when is_binary(V), byte_size(V) =< ?MAX_HEADER ->
    lists:all(fun(C) -> C >= 16#20 andalso C =< 16#7E end, binary_to_list(V));
safe_header(_) -> false.

%%% 1. headers carry no untrusted text

hostile_kernel_reply_has_safe_top_level_keys() ->
    {error, {shader_error, Raw}} = kem:execute(<<"hostile">>, <<1, 2, 3, 4>>, #{}),
    %% The port's detail does quote the source: this test means something.
    ?assertNotEqual(nomatch, binary:match(Raw, <<"Set-Cookie: pwned=1">>)),
    ?assertNotEqual(nomatch, binary:match(Raw, <<"\n">>)),
    ?assert(lists:any(fun(C) -> C > 127 end, binary_to_list(Raw))),
    {error, Reply} = dev_kem:execute_kernel(#{}, hostile_request(), #{}),
    ?assertMatch(#{<<"status">> := 422, <<"reason">> := <<"shader_error">>}, Reply),
    Json = assert_safe_top_level(Reply),
    %% The full detail, in the JSON body only.
    ?assertEqual(kem_redact:text(Raw), maps:get(<<"details">>, Json)),
    ?assertMatch(#{<<"reason">> := <<"shader_error">>, <<"error">> := _}, Json).

%% Usage keys of a success, a 400, a chain failure and a 503 retry: the
%% same rule on every road.
every_reply_path_has_safe_top_level_keys() ->
    {ok, Ok} = dev_kem:execute_kernel(#{}, #{<<"kernel-id">> => <<"double">>, <<"input-data">> => <<1, 2, 3, 4>>}, #{}),
    ?assertEqual(<<2, 4, 6, 8>>, maps:get(<<"body">>, Ok)),
    [?assert(is_integer(V) orelse safe_header(V), {K, V}) || {K, V} <- maps:to_list(maps:remove(<<"body">>, Ok))],
    Bad = kem_json:encode(#{<<"kernel-id">> => <<"x\r\nSet-Cookie: a=1", 16#C3, 16#A9>>, <<"input-data">> => [1]}),
    {error, BadReply} = dev_kem:execute_kernel(#{}, #{<<"body">> => Bad}, #{}),
    assert_safe_top_level(BadReply),
    Chain = kem_json:encode(#{<<"input-data">> => [1, 2, 3, 4],
                              <<"steps">> => [#{<<"kernel-id">> => <<"double">>}, #{<<"kernel-id">> => <<"hostile">>}]}),
    {error, ChainReply} = dev_kem:execute_chain(#{}, #{<<"body">> => Chain}, #{}),
    ChainJson = assert_safe_top_level(ChainReply),
    ?assertMatch(<<"step 2: ", _/binary>>, maps:get(<<"details">>, ChainJson)),
    BadStep = kem_json:encode(#{<<"steps">> => [#{<<"kernel-id">> => <<"double">>, <<"\nSet-Cookie: b">> => 1}]}),
    {error, BadStepReply} = dev_kem:execute_chain(#{}, #{<<"body">> => BadStep}, #{}),
    assert_safe_top_level(BadStepReply).

%%% the same over HTTP: inets httpd plays the node

%% @private httpd's callback: dev_kem's reply as HyperBEAM's httpsig road
%% sends it (hb_http:reply/5, encode_reply/3): `status' the status line,
%% every other top-level key but `body' a header, the body the body. No
%% value is checked or escaped on the way, as cowboy checks none.
do(#mod{}) ->
    {Status, Reply} = case dev_kem:execute_kernel(#{}, hostile_request(), #{}) of
                          {ok, R} -> {maps:get(<<"status">>, R, 200), R};
                          {error, R} -> {maps:get(<<"status">>, R, 500), R}
                      end,
    Body = maps:get(<<"body">>, Reply, <<>>),
    Headers = [{binary_to_list(K), header_text(V)} || {K, V} <- maps:to_list(Reply),
                                                       K =/= <<"body">>, K =/= <<"status">>],
    {proceed, [{response, {response, [{code, Status}, {content_length, integer_to_list(byte_size(Body))}
                                      | Headers], binary_to_list(Body)}}]}.

header_text(V) when is_integer(V) -> integer_to_list(V);
header_text(V) when is_binary(V) -> binary_to_list(V).

hostile_kernel_over_real_http() ->
    Dir = filename:join("/tmp", "kem_isolation_httpd_" ++ os:getpid()),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    {ok, Httpd} = inets:start(httpd, [{port, 0}, {bind_address, {127, 0, 0, 1}}, {server_name, "kem"},
                                      {server_root, Dir}, {document_root, Dir}, {modules, [?MODULE]}]),
    try
        [{port, Port}] = httpd:info(Httpd, [port]),
        Url = "http://127.0.0.1:" ++ integer_to_list(Port) ++ "/~kem@1.0/execute_kernel",
        Result = httpc:request(get, {Url, []}, [{timeout, 30000}], [{body_format, binary}]),
        ?assertMatch({ok, {{_, 422, _}, _, _}}, Result),
        {ok, {_, Headers, Body}} = Result,
        io:format(user, "~nhostile kernel over HTTP: headers ~p~n", [[K || {K, _} <- Headers]]),
        ?assertEqual([], [H || {K, _} = H <- Headers, string:lowercase(K) =:= "set-cookie"]),
        ?assertMatch({ok, #{<<"reason">> := <<"shader_error">>, <<"details">> := _}}, kem_json:decode(Body)),
        {ok, #{<<"details">> := Details}} = kem_json:decode(Body),
        ?assertNotEqual(nomatch, binary:match(Details, <<"Set-Cookie: pwned=1">>))
    after
        inets:stop(httpd, Httpd),
        file:del_dir_r(Dir)
    end.

%%% 3. chains: bounded dispatch, one budget per request, quarantine

chain(Map) -> dev_kem:execute_chain(#{}, #{<<"body">> => kem_json:encode(Map)}, #{}).

details(Reply) ->
    {ok, #{<<"details">> := D}} = kem_json:decode(maps:get(<<"body">>, Reply)),
    D.

%% 87 bytes that held a port for a whole timeout: refused at once, the port
%% untouched. A step may dispatch at most as many workgroups as
%% execute_kernel would for its output (one per 4-byte element).
chain_dispatch_is_bounded_by_its_output() ->
    [Port] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    T0 = now_ms(),
    {error, Reply} = chain(#{<<"input-data">> => [1, 2, 3, 4],
                             <<"steps">> => [#{<<"kernel-id">> => <<"double">>},
                                             #{<<"kernel-id">> => <<"double">>, <<"workgroups">> => [65535, 65535, 64]}]}),
    ?assert(now_ms() - T0 < 2000),
    ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"bad_args">>}, Reply),
    ?assertMatch(<<"step 2: ", _/binary>>, details(Reply)),
    ?assertEqual(OsPid, kem_port:os_pid(Port)),
    %% Within the bound: runs, with the right bytes.
    [begin
         Input = crypto:strong_rand_bytes(Size),
         Groups = (Size div 4 + 63) div 64,
         ?assertEqual({ok, kem_ref:double_ref(Input, Size)},
                      body(chain(#{<<"input-data">> => binary_to_list(Input),
                                   <<"steps">> => [#{<<"kernel-id">> => <<"double">>, <<"workgroups">> => [Groups, 1, 1]}]})))
     end || Size <- [256, 4096, 65536]].

body({ok, #{<<"status">> := 200, <<"body">> := B}}) -> {ok, B};
body(Other) -> Other.

%% Each step within the budget, all of them together over it: refused
%% before anything is framed. Under it: the composed result.
chain_buffers_count_against_one_request_budget() ->
    {ok, Default} = application:get_env(kem, request_max_output_bytes),
    ok = application:set_env(kem, request_max_output_bytes, 1 bsl 20),
    try
        Step = #{<<"kernel-id">> => <<"double">>, <<"output-size">> => 256 bsl 10},
        {error, Over} = chain(#{<<"input-data">> => [1, 2, 3, 4], <<"steps">> => lists:duplicate(5, Step)}),
        ?assertMatch(#{<<"status">> := 413, <<"reason">> := <<"too_large">>}, Over),
        Input = crypto:strong_rand_bytes(4096),
        Want = kem_ref:double_ref(kem_ref:double_ref(Input, 256 bsl 10), 256 bsl 10),
        ?assertEqual({ok, Want}, body(chain(#{<<"input-data">> => binary_to_list(Input),
                                              <<"steps">> => lists:duplicate(2, Step)})))
    after
        application:set_env(kem, request_max_output_bytes, Default)
    end.

%%% 4. small findings of the JSON body

duplicate_json_keys_are_refused() ->
    Dup = <<"{\"kernel-id\": \"double\", \"input-data\": [1,2,3,4], \"kernel-id\": \"other\"}">>,
    {error, Reply} = dev_kem:execute_kernel(#{}, #{<<"body">> => Dup}, #{}),
    ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"bad_args">>}, Reply),
    ?assertNotEqual(nomatch, binary:match(details(Reply), <<"kernel-id">>)),
    %% Nested (a chain step), and the two spellings of one field.
    NestedDup = <<"{\"steps\": [{\"kernel-id\": \"double\", \"params\": [1], \"params\": [2]}]}">>,
    {error, Nested} = dev_kem:execute_chain(#{}, #{<<"body">> => NestedDup}, #{}),
    ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"bad_args">>}, Nested),
    ?assertNotEqual(nomatch, binary:match(details(Nested), <<"params">>)),
    Both = kem_json:encode(#{<<"kernel-id">> => <<"double">>, <<"kernel_id">> => <<"other">>, <<"input-data">> => [1]}),
    {error, BothReply} = dev_kem:execute_kernel(#{}, #{<<"body">> => Both}, #{}),
    ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"bad_args">>}, BothReply),
    %% Without duplicates: served.
    Input = crypto:strong_rand_bytes(64),
    Good = kem_json:encode(#{<<"kernel-id">> => <<"double">>, <<"input-data">> => binary_to_list(Input)}),
    ?assertEqual({ok, kem_ref:double_ref(Input, 64)}, body(dev_kem:execute_kernel(#{}, #{<<"body">> => Good}, #{}))).

%% A JSON string is not bytes (UTF-8? base64? hex?): refused, saying what
%% to send. A message key (an HTTP header value) stays raw bytes.
string_input_data_is_refused() ->
    Str = kem_json:encode(#{<<"kernel-id">> => <<"double">>, <<"input-data">> => <<"AQIDBA==">>}),
    {error, Reply} = dev_kem:execute_kernel(#{}, #{<<"body">> => Str}, #{}),
    ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"bad_args">>}, Reply),
    ?assertNotEqual(nomatch, binary:match(details(Reply), <<"application/octet-stream">>)),
    ChainStr = kem_json:encode(#{<<"input-data">> => <<"AQIDBA==">>, <<"steps">> => [#{<<"kernel-id">> => <<"double">>}]}),
    {error, ChainReply} = dev_kem:execute_chain(#{}, #{<<"body">> => ChainStr}, #{}),
    ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"bad_args">>}, ChainReply),
    ?assertEqual({ok, <<2, 4, 6, 8>>},
                 body(dev_kem:execute_kernel(#{}, #{<<"kernel-id">> => <<"double">>, <<"input-data">> => <<1, 2, 3, 4>>}, #{}))).

%%% 2. a port owner that cannot answer is not a kernel's fault

%% The reader stuck in an inline call (sleep_reader), an 8 MiB frame fills
%% the pipe and the owner is suspended on its busy port: an innocent
%% `double' call's owner never answers. That says nothing of `double'.
innocent_kernel_behind_a_suspended_owner_is_not_quarantined() ->
    {ok, Default} = application:get_env(kem, timeout),
    ok = application:set_env(kem, timeout, 1000),
    Self = self(),
    [Port] = kem_sup:port_names(),
    try
        spawn(fun() -> Self ! {reader, kem:call(test_hook, {sleep_reader, 6000}, 20000)} end),
        %% States, not sleeps: the hook is sent; then the filler's frame
        %% waits in the port's queue behind the full pipe (the port is
        %% busy: the owner's next port_command, the innocent call's,
        %% suspends it).
        ok = until(fun() -> maps:size(maps:get(pending, sys:get_state(Port))) >= 1 end, now_ms() + 5000),
        #{port := PortRef} = sys:get_state(Port),
        Big = crypto:strong_rand_bytes(8 bsl 20),
        spawn(fun() -> Self ! {filler, kem:execute(<<"double">>, Big, #{timeout => 20000})} end),
        ok = until(fun() -> element(2, erlang:port_info(PortRef, queue_size)) > 4 bsl 20 end, now_ms() + 5000),
        Innocent = kem:execute(<<"double">>, <<1, 2, 3, 4>>, #{}),
        io:format(user, "~ninnocent call behind a suspended owner: ~p~n", [Innocent]),
        ?assertEqual({error, {timeout, <<"the port owner did not answer in time">>}}, Innocent),
        ?assertEqual(ok, kem_quarantine:check(<<"double">>)),
        [receive {Tag, _} -> ok after 30000 -> error({no_answer, Tag}) end || Tag <- [reader, filler]],
        ok = kem_test_app:wait_for_service(10000),
        ?assertEqual({ok, <<2, 6, 10, 14>>}, kem:execute(<<"double">>, <<1, 3, 5, 7>>, #{}))
    after
        application:set_env(kem, timeout, Default)
    end.

%% A chain that outlives the default timeout on the GPU counts against its
%% kernels like a call does, for chains: its repeat is refused at once. A
%% chain of several kernels cannot say which one ran away, so a kernel
%% chained with the runaway is refused in chains only, never for calls.
timed_out_chain_quarantines_its_kernels_for_chains() ->
    [{ok, _}] = [kem:execute(<<"runaway">>, <<0:32>>, #{workgroups => {1, 1, 1}, timeout => 60000})],
    {ok, Default} = application:get_env(kem, timeout),
    ok = application:set_env(kem, timeout, 1000),
    Runaway = [#{kernel => <<"double">>}, #{kernel => <<"runaway">>, workgroups => {1024, 1024, 1}}],
    try
        ?assertMatch({error, {timeout, _}}, kem:chain(Runaway, #{input => <<0:32>>})),
        ok = kem_test_app:wait_for_service(10000),
        T0 = now_ms(),
        ?assertMatch({error, {quarantined, _}}, kem:chain(Runaway, #{input => <<0:32>>})),
        ?assertMatch({error, {quarantined, _}}, kem:chain([#{kernel => <<"double">>}], #{input => <<1:32/little>>})),
        ?assert(now_ms() - T0 < 500),
        %% Calls of the chained kernel are not touched.
        ?assertEqual(ok, kem_quarantine:check(<<"double">>)),
        ?assertEqual({ok, <<2, 6, 10, 14>>}, kem:execute(<<"double">>, <<1, 3, 5, 7>>, #{}))
    after
        application:set_env(kem, timeout, Default)
    end.
