%%% @doc eunit tests of by-name bindings in sessions and chains and of copy
%%% and clear steps (docs/sessions.md), through the kem API against the real
%%% Python port, with Erlang references on fresh random data.
-module(kem_session_named_tests).
-include_lib("eunit/include/eunit.hrl").

named_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 60, fun in_place_by_name_with_a_uniform/0},
      {timeout, 60, fun outputs_come_back_by_name/0},
      {timeout, 60, fun kernel_copy_clear_kernel/0},
      {timeout, 60, fun bitonic_sort_with_copy_steps/0},
      {timeout, 60, fun copy_refusals_name_the_step/0},
      {timeout, 60, fun no_guessed_dispatch/0},
      {timeout, 60, fun dev_kem_chain_reads_copy_and_clear/0}]}.

%% The Python tests' kernels (tests/session_kernels): one source for both sides.
start() ->
    Dir = filename:join(kem_test_app:repo_root(), "tests/session_kernels"),
    kem_test_app:start([{kernel_dir, Dir}]).

stop(Apps) -> kem_test_app:stop(Apps).

words(Bin) -> [W || <<W:32/little>> <= Bin].
from_words(Ws) -> << <<(W band 16#FFFFFFFF):32/little>> || W <- Ws >>.
random_words(N) -> crypto:strong_rand_bytes(4 * N).

%% axpy_named: y += k * x, its uniform at binding 0: no kem@1.0 shape.
in_place_by_name_with_a_uniform() ->
    {ok, S} = kem:session_open(#{}),
    N = 1 + rand:uniform(5000),
    K = rand:uniform(1 bsl 31),
    X = random_words(N),
    Y = random_words(N),
    ok = kem:buffer_create(S, x, X),
    ok = kem:buffer_create(S, y, Y),
    ?assertEqual({ok, #{}}, kem:session_call(S, <<"axpy_named">>, <<>>,
                                             #{buffers => #{params => from_words([N, K])}, grid => {N, 1, 1}})),
    ?assertEqual({ok, from_words([B + K * A || {A, B} <- lists:zip(words(X), words(Y))])}, kem:buffer_read(S, y)),
    ok = kem:session_close(S).

outputs_come_back_by_name() ->
    N = 1 + rand:uniform(3000),
    A = random_words(N),
    B = random_words(N),
    Step = #{kernel => <<"two_out">>, buffers => #{a => A, b => B}, outputs => #{total => 4 * N, diff => 4 * N},
             grid => {N, 1, 1}},
    Pairs = lists:zip(words(A), words(B)),
    ?assertEqual({ok, #{<<"total">> => from_words([P + Q || {P, Q} <- Pairs]),
                        <<"diff">> => from_words([P - Q || {P, Q} <- Pairs])}},
                 kem:chain([Step], #{})).

kernel_copy_clear_kernel() ->
    {ok, S} = kem:session_open(#{}),
    Size = 4 * (4 + rand:uniform(4000)),
    Input = crypto:strong_rand_bytes(Size),
    ok = kem:buffer_create(S, keep, Size),
    Half = Size div 8 * 4,
    Steps = [#{kernel => <<"double">>, output => t, output_size => Size},
             #{copy => {t, 0, keep, 0, Size}},
             #{clear => {t, Half, Size - Half}},
             #{kernel => <<"double">>, input => t, output => u, output_size => Size}],
    Once = kem_ref:double_ref(Input, Size),
    Cleared = <<(binary:part(Once, 0, Half))/binary, 0:((Size - Half) * 8)>>,
    ?assertEqual({ok, #{<<"keep">> => Once, <<"t">> => Cleared, <<"u">> => kem_ref:double_ref(Cleared, Size)}},
                 kem:chain(Steps, #{session => S, input => Input, return => [keep, t, u]})),
    ok = kem:session_close(S).

bitonic_sort_with_copy_steps() ->
    {ok, S} = kem:session_open(#{}),
    N = 256,
    Data = random_words(N),
    ok = kem:buffer_create(S, src, Data),
    ok = kem:buffer_create(S, dst, 4 * N),
    Passes = [{K, J} || K <- [1 bsl E || E <- lists:seq(1, 8)], J <- halves(K div 2)],
    Steps = lists:append([[#{kernel => <<"bitonic_pass">>, buffers => #{pass_ => from_words([K, J])}, grid => {N, 1, 1}},
                           #{copy => {dst, 0, src, 0, 4 * N}}] || {K, J} <- Passes]),
    ?assertEqual({ok, #{<<"src">> => from_words(lists:sort(words(Data)))}},
                 kem:chain(Steps, #{session => S, return => [src]})),
    ok = kem:session_close(S).

halves(0) -> [];
halves(J) -> [J | halves(J div 2)].

copy_refusals_name_the_step() ->
    {ok, S} = kem:session_open(#{}),
    ok = kem:buffer_create(S, a, random_words(16)),
    ok = kem:buffer_create(S, b, 64),
    Ok = #{copy => {a, 0, b, 0, 64}},
    [?assertMatch({error, {Reason, #{step := 2, detail := _}}}, kem:chain([Ok, Bad], #{session => S}))
     || {Bad, Reason} <- [{#{copy => {a, 2, b, 0, 4}}, bad_args},
                          {#{copy => {a, 32, b, 0, 64}}, bad_args},
                          {#{copy => {a, 0, a, 32, 16}}, bad_args},
                          {#{copy => {a, 0, nope, 0, 4}}, no_buffer},
                          {#{clear => {b, 4, 64}}, bad_args},
                          {#{clear => {b, 0}}, bad_args}]],
    ?assertEqual({ok, <<0:512>>}, kem:buffer_read(S, b)),
    ok = kem:session_close(S).

no_guessed_dispatch() ->
    {ok, S} = kem:session_open(#{}),
    ok = kem:buffer_create(S, x, 64),
    ok = kem:buffer_create(S, y, 64),
    {error, {bad_args, Detail}} = kem:session_call(S, <<"axpy_named">>, <<>>, #{buffers => #{params => from_words([16, 1])}}),
    ?assertNotEqual(nomatch, binary:match(Detail, <<"grid">>)),
    ok = kem:session_close(S).

%% execute_chain's JSON: "copy" and "clear" as arrays, run on the request road.
dev_kem_chain_reads_copy_and_clear() ->
    Input = crypto:strong_rand_bytes(64),
    Body = #{<<"input-data">> => binary_to_list(Input),
             <<"steps">> => [#{<<"kernel-id">> => <<"double">>, <<"output">> => <<"t">>},
                             #{<<"kernel-id">> => <<"double">>, <<"output">> => <<"u">>, <<"output-size">> => 64},
                             #{<<"copy">> => [<<"t">>, 0, <<"u">>, 32, 32]},
                             #{<<"clear">> => [<<"u">>, 0, 8]},
                             #{<<"kernel-id">> => <<"double">>, <<"input">> => <<"u">>}]},
    {ok, Steps, Opts} = dev_kem_chain:request({json, Body}),
    ?assertEqual(#{copy => {<<"t">>, 0, <<"u">>, 32, 32}}, lists:nth(3, Steps)),
    Once = kem_ref:double_ref(Input, 64),
    Twice = kem_ref:double_ref(Once, 64),
    U = <<0:64, (binary:part(Twice, 8, 24))/binary, (binary:part(Once, 0, 32))/binary>>,
    ?assertMatch({{ok, _}, _}, kem:request_chain_usage(Steps, Opts)),
    {{ok, Out}, _} = kem:request_chain_usage(Steps, Opts),
    ?assertEqual(kem_ref:double_ref(U, 64), Out),
    ?assertMatch({bad_request, bad_request, <<"step 1: ", _/binary>>},
                 dev_kem_chain:request({json, Body#{<<"steps">> => [#{<<"copy">> => [<<"t">>, 0, <<"u">>, 0, 4],
                                                                       <<"kernel-id">> => <<"double">>}]}})).
