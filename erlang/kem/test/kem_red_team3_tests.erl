%%% @doc Red team of dev_kem's named calls and chains by name (issue 25:
%%% dev_kem_run, dev_kem_chain's per-step `buffers', `outputs' and
%%% `constants', kem_chain_budget), through the real port.
%%%
%%% Findings (each failed before its fix): a buffer's slot given twice, as
%%% `<<"0/1">>' and inside its bind group's message `#{<<"0">> =>
%%% #{<<"1">> => ...}}' (a multipart part `buffers/0/1' arrives so), was
%%% flattened by maps:from_list, which keeps one: the other caller's bytes
%%% went unread with no word on `run' (and likewise an output size given
%%% twice). And a chain step's constants naming an override the kernel
%%% lacks raised KeyError in the port's admission (a 500 `internal'): now
%%% 400 naming it. And `$' in the name and digit checks matched before a
%%% final newline: a chain buffer <<"c2\n">> came back as a reply's nested
%%% key, and "gas-limit": "100\n" raised badarg out of execute_chain. Now a 400 naming the slot, as the port
%%% answers a name given twice.
%%%
%%% Held: a chain that reads or binds a buffer it did not make is a 4xx
%%% naming only that name; step errors carry no port internals; a step's
%%% kernel-id with CR LF puts no byte of it in a reply's top-level value;
%%% JSON byte arrays with values outside 0-255 (negative, floats, atoms)
%%% are 400 naming the buffer; a byte array one word over the request
%%% budget is 413 before any port sees it; bad constant names and values
%%% are 400 naming the step.
-module(kem_red_team3_tests).
-include_lib("eunit/include/eunit.hrl").

-include("kem_named_kernels.hrl").

-define(MAX_HEADER, 4096).

red_team_test_() ->
    {setup,
     fun() -> kem_test_app:start_with_kernels("kem_red_team3", [{"add", ?ADD}], []) end,
     fun kem_test_app:stop_with_kernels/1,
     [{timeout, 60, fun a_slot_given_twice_on_run_is_refused/0},
      {timeout, 60, fun a_slot_given_twice_in_a_chain_step_is_refused/0},
      {timeout, 60, fun a_chain_reads_only_buffers_it_made/0},
      {timeout, 60, fun untrusted_text_stays_out_of_reply_values/0},
      {timeout, 60, fun json_bytes_outside_0_255_and_over_budget/0},
      {timeout, 60, fun bad_constants_name_the_step/0},
      {timeout, 60, fun a_trailing_newline_is_no_name_nor_digits/0}]}.

from_words(Ws) -> << <<W:32/little>> || W <- Ws >>.
random_words(N) -> [rand:uniform(1 bsl 31) || _ <- lists:seq(1, N)].
sum(A, B) -> from_words([X + Y || {X, Y} <- lists:zip(A, B)]).

details(Reply) ->
    {ok, #{<<"details">> := D}} = kem_json:decode(maps:get(<<"body">>, Reply)),
    D.

buffers({ok, #{<<"status">> := 200, <<"buffers">> := Nested}}) ->
    {ok, maps:map(fun(_, #{<<"body">> := B}) -> B end, Nested)};
buffers(Other) -> Other.

refused(Status, Text, {error, #{<<"status">> := Status} = Reply}) ->
    D = details(Reply),
    ?assertNotEqual(nomatch, binary:match(D, Text), D),
    assert_no_internals(D),
    D;
refused(Status, Text, Other) ->
    ?assertEqual({refused, Status, Text}, Other).

assert_no_internals(D) ->
    [?assertEqual(nomatch, binary:match(D, Word), D)
     || Word <- [<<"Traceback">>, <<"Otp">>, <<".py">>, <<"/tmp">>, <<"kem_port">>, <<"{">>]].

%% The slot a, b and c are bound at: a = 0/0, b = 0/1, c = 0/2.
add_run(Buffers, Outputs, N) ->
    dev_kem:run(#{}, #{<<"kernel-id">> => <<"add">>, <<"buffers">> => Buffers, <<"outputs">> => Outputs,
                      <<"workgroups">> => [(N + 63) div 64, 1, 1]}, #{}).

%% BEFORE: `buffers/0/1' and `buffers/0' holding `1' were one slot of two
%% values; one was kept (maps:from_list), the other dropped unread.
a_slot_given_twice_on_run_is_refused() ->
    N = 64, A = random_words(N), B = random_words(N), Other = random_words(N),
    ?assertEqual({ok, #{<<"c">> => sum(A, B)}},
                 buffers(add_run(#{<<"0/0">> => from_words(A), <<"0">> => #{<<"1">> => from_words(B)}},
                                 #{<<"c">> => 4 * N}, N))),
    Twice = #{<<"0/0">> => from_words(A), <<"0/1">> => from_words(B), <<"0">> => #{<<"1">> => from_words(Other)}},
    refused(400, <<"'0/1' given twice">>, add_run(Twice, #{<<"c">> => 4 * N}, N)),
    %% An output's size likewise: #{"0/2" => 4N, "0" => #{"2" => 8N}}.
    refused(400, <<"'0/2' given twice">>,
            add_run(#{<<"a">> => from_words(A), <<"b">> => from_words(B)},
                    #{<<"0/2">> => 4 * N, <<"0">> => #{<<"2">> => 8 * N}}, N)).

%% A chain step's buffers are WGSL names (the port's session protocol): a
%% bind group's message, flattened to `G/B', is refused naming the slot,
%% and given twice it is refused before any port (dev_kem_run's check).
a_slot_given_twice_in_a_chain_step_is_refused() ->
    N = 32, A = random_words(N), B = random_words(N),
    Step = fun(Buffers) -> #{<<"kernel-id">> => <<"add">>, <<"buffers">> => Buffers,
                             <<"outputs">> => #{<<"c">> => 4 * N}, <<"grid">> => [N, 1, 1]} end,
    Chain = fun(Buffers) -> dev_kem:execute_chain(#{}, #{<<"body">> => #{<<"steps">> => [Step(Buffers)]}}, #{}) end,
    ?assertEqual({ok, #{<<"c">> => sum(A, B)}}, buffers(Chain(#{<<"a">> => from_words(A), <<"b">> => from_words(B)}))),
    D1 = refused(400, <<"'0/1'">>, Chain(#{<<"a">> => from_words(A), <<"0">> => #{<<"1">> => from_words(B)}})),
    ?assertMatch(<<"step 1: ", _/binary>>, D1),
    D2 = refused(400, <<"'0/1' given twice">>,
                 Chain(#{<<"a">> => from_words(A), <<"0/1">> => from_words(B), <<"0">> => #{<<"1">> => from_words(A)}})),
    ?assertMatch(<<"step 1: ", _/binary>>, D2).

%% dev_kem chains have no session: a name no earlier step made is a 4xx
%% naming it, whether read as `input', bound by `bind' or read by name.
a_chain_reads_only_buffers_it_made() ->
    N = 16, A = from_words(random_words(N)),
    Steps = fun(Second) ->
                    [#{<<"kernel-id">> => <<"add">>, <<"buffers">> => #{<<"a">> => A, <<"b">> => A},
                       <<"outputs">> => #{<<"c">> => 4 * N}, <<"grid">> => [N, 1, 1]}, Second]
            end,
    Chain = fun(Second) -> dev_kem:execute_chain(#{}, #{<<"body">> => #{<<"steps">> => Steps(Second)}}, #{}) end,
    Second = #{<<"kernel-id">> => <<"add">>, <<"outputs">> => #{<<"c2">> => 4 * N}, <<"grid">> => [N, 1, 1],
               <<"bind">> => #{<<"c">> => <<"c2">>}},
    [begin
         {error, #{<<"status">> := S} = Reply} = Chain(Second#{<<"bind">> => Bind}),
         ?assert(S >= 400 andalso S < 500),
         D = details(Reply),
         ?assertMatch(<<"step 2: ", _/binary>>, D),
         ?assertNotEqual(nomatch, binary:match(D, Name), D),
         assert_no_internals(D)
     end || {Bind, Name} <- [{#{<<"a">> => <<"secret">>, <<"b">> => <<"c">>}, <<"secret">>},
                             {#{<<"a">> => <<"c">>, <<"b">> => <<"session_of_another">>}, <<"session_of_another">>}]],
    {error, #{<<"status">> := S} = Reply} =
        dev_kem:execute_chain(#{}, #{<<"body">> => #{<<"steps">> => [#{<<"kernel-id">> => <<"add">>, <<"input">> => <<"nope">>}]}}, #{}),
    ?assert(S >= 400 andalso S < 500),
    assert_no_internals(details(Reply)).

%% Every top-level value of a reply is a status, or a short line of
%% printable ASCII: a stranger's kernel id with CR LF ends no header.
untrusted_text_stays_out_of_reply_values() ->
    Evil = <<"add\r\nSet-Cookie: stolen=1">>,
    Replies = [dev_kem:execute_chain(#{}, #{<<"body">> => #{<<"steps">> => [#{<<"kernel-id">> => Evil}]}}, #{}),
               dev_kem:execute_chain(#{}, #{<<"body">> => kem_json:encode(#{<<"steps">> => [#{<<"kernel-id">> => Evil}]})}, #{}),
               dev_kem:run(#{}, #{<<"kernel-id">> => Evil, <<"workgroups">> => [1, 1, 1]}, #{}),
               dev_kem:run(#{}, #{<<"kernel-id">> => <<"add">>, <<"workgroups">> => [1, 1, 1],
                                  <<"buffers">> => #{<<"a\r\nX-Evil: 1">> => <<1, 2, 3, 4>>}}, #{})],
    [begin
         {error, Reply} = R,
         [?assert(is_integer(V) orelse safe_header(V), {K, V})
          || {K, V} <- maps:to_list(maps:without([<<"body">>], Reply))],
         ?assertNot(maps:is_key(<<"set-cookie">>, Reply)),
         ?assertNot(maps:is_key(<<"x-evil">>, Reply))
     end || R <- Replies].

safe_header(V) when is_binary(V), byte_size(V) =< ?MAX_HEADER ->
    lists:all(fun(C) -> C >= 16#20 andalso C =< 16#7E end, binary_to_list(V));
safe_header(_) -> false.

json_bytes_outside_0_255_and_over_budget() ->
    Json = fun(Buffers) ->
                   dev_kem:execute_chain(#{}, #{<<"body">> => kem_json:encode(#{<<"steps">> => [
                       #{<<"kernel-id">> => <<"add">>, <<"buffers">> => Buffers, <<"outputs">> => #{<<"c">> => 16},
                         <<"grid">> => [4, 1, 1]}]})}, #{})
           end,
    [refused(400, <<"buffer 'a'">>, Json(#{<<"a">> => Bad, <<"b">> => lists:duplicate(16, 0)}))
     || Bad <- [[-1 | lists:duplicate(15, 0)], [1.0 | lists:duplicate(15, 0)], [true | lists:duplicate(15, 0)],
                [null], [[1]], [#{<<"x">> => 1}]]],
    {ok, Default} = application:get_env(kem, request_max_output_bytes),
    ok = application:set_env(kem, request_max_output_bytes, 4096),
    try
        %% a and b 2 KiB each and c 16 bytes: 16 over; a word less and it runs.
        Over = Json(#{<<"a">> => lists:duplicate(2048, 1), <<"b">> => lists:duplicate(2048, 2)}),
        refused(413, <<"over this request's limit of 4096">>, Over),
        Fits = Json(#{<<"a">> => lists:duplicate(2040, 1), <<"b">> => lists:duplicate(2040, 2)}),
        ?assertEqual({ok, #{<<"c">> => from_words(lists:duplicate(4, 16#03030303))}}, buffers(Fits))
    after
        application:set_env(kem, request_max_output_bytes, Default)
    end.

bad_constants_name_the_step() ->
    Step = #{<<"kernel-id">> => <<"add">>, <<"buffers">> => #{<<"a">> => <<0:128>>, <<"b">> => <<0:128>>},
             <<"outputs">> => #{<<"c">> => 16}, <<"grid">> => [4, 1, 1]},
    Chain = fun(C) -> dev_kem:execute_chain(#{}, #{<<"body">> => #{<<"steps">> => [Step#{<<"constants">> => C}]}}, #{}) end,
    [begin
         {error, #{<<"status">> := 400} = Reply} = Chain(C),
         D = details(Reply),
         ?assertMatch(<<"step 1: ", _/binary>>, D),
         assert_no_internals(D)
     end || C <- [#{<<"x\r\ny">> => 1}, #{<<"factor">> => <<"1e999">>}, #{<<"nope">> => 1}, #{<<"factor">> => true},
                  #{<<"f">> => -0.0}, #{<<"__x">> => 1}]].

%% BEFORE: `$' in Python's re and in PCRE also matches before a final
%% newline. A chain's buffer named <<"c2\n">> passed the port's name check
%% (sessions.NAME) and dev_kem_run's plain_name, and came back as the
%% nested key `buffers/c2\n' (a multipart part's name, a header line);
%% "gas-limit": "100\n" passed the digits check and binary_to_integer/1
%% raised badarg out of dev_kem:execute_chain (no reply). Now each is a 400.
a_trailing_newline_is_no_name_nor_digits() ->
    N = 4, A = from_words(random_words(N)),
    Step = fun(Name) -> #{<<"kernel-id">> => <<"add">>, <<"buffers">> => #{<<"a">> => binary_to_list(A), <<"b">> => binary_to_list(A)},
                          <<"outputs">> => #{Name => 4 * N}, <<"bind">> => #{<<"c">> => Name}, <<"grid">> => [N, 1, 1]} end,
    Json = fun(Body) -> dev_kem:execute_chain(#{}, #{<<"body">> => kem_json:encode(Body)}, #{}) end,
    ?assertMatch({ok, #{<<"buffers">> := #{<<"c2">> := _}}}, Json(#{<<"steps">> => [Step(<<"c2">>)]})),
    [begin
         Reply = Json(#{<<"steps">> => [Step(Name)]}),
         case Reply of
             {ok, #{<<"buffers">> := Nested}} -> ?assertEqual([], [K || K <- maps:keys(Nested), binary:match(K, [<<"\n">>, <<"\r">>]) =/= nomatch]);
             _ -> refused(400, <<"step 1: ">>, Reply)
         end
     end || Name <- [<<"c2\n">>, <<"c2\r\n">>]],
    refused(400, <<"gas-limit">>, Json(#{<<"steps">> => [Step(<<"c2">>)], <<"gas-limit">> => <<"100\n">>})),
    ?assertMatch({ok, _}, Json(#{<<"steps">> => [Step(<<"c2">>)], <<"gas-limit">> => <<"100000">>})).
