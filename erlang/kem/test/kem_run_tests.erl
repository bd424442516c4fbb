%%% @doc eunit tests of kem:run/3 (a kernel by named buffers, issue 25)
%%% through the real Python port, against Erlang references on fresh random
%%% data: two inputs and an output at binding 2, an in-place buffer with its
%%% uniform at binding 0, outputs in a second bind group, and refusals.
-module(kem_run_tests).
-include_lib("eunit/include/eunit.hrl").

-include("kem_named_kernels.hrl").

run_test_() ->
    {setup,
     fun() -> kem_test_app:start_with_kernels("run", [{"add", ?ADD}, {"scale", ?SCALE}], []) end,
     fun kem_test_app:stop_with_kernels/1,
     [{timeout, 60, fun two_inputs_one_output/0},
      {timeout, 60, fun in_place_with_a_uniform_and_a_second_group/0},
      {timeout, 60, fun refusals_name_the_buffer/0}]}.

words(Bin) -> [W || <<W:32/little>> <= Bin].
from_words(Ws) -> << <<W:32/little>> || W <- Ws >>.
random_words(N) -> [rand:uniform(1 bsl 30) || _ <- lists:seq(1, N)].

two_inputs_one_output() ->
    lists:foreach(
        fun(N) ->
            A = random_words(N), B = random_words(N),
            Groups = {(N + 63) div 64, 1, 1},
            {ok, Out} = kem:run(<<"add">>, #{<<"a">> => from_words(A), b => from_words(B)},
                                #{outputs => #{<<"c">> => 4 * N}, workgroups => Groups}),
            ?assertEqual([<<"c">>], maps:keys(Out)),
            ?assertEqual([X + Y || {X, Y} <- lists:zip(A, B)], words(maps:get(<<"c">>, Out)))
        end, [1, 64, 1000]).

in_place_with_a_uniform_and_a_second_group() ->
    N = 100 + rand:uniform(200),
    V = random_words(N),
    Params = <<3:32/little, N:32/little>>,
    {ok, Out} = kem:run(<<"scale">>, #{params => Params, <<"values">> => from_words(V)},
                        #{outputs => #{<<"1/2">> => 4 * N}, workgroups => {(N + 31) div 32, 1, 1}}),
    Scaled = [(X * 3) band 16#FFFFFFFF || X <- V],
    ?assertEqual(Scaled, words(maps:get(<<"values">>, Out))),
    ?assertEqual([(X * 2) band 16#FFFFFFFF || X <- Scaled], words(maps:get(<<"doubled">>, Out))).

refusals_name_the_buffer() ->
    Four = <<0:32>>,
    {error, {bad_args, NoSize}} = kem:run(<<"add">>, #{a => Four, b => Four}, #{workgroups => {1, 1, 1}}),
    ?assertNotEqual(nomatch, binary:match(NoSize, <<"output 'c'">>)),
    {error, {bad_args, NoInput}} = kem:run(<<"add">>, #{a => Four}, #{outputs => #{c => 4}, workgroups => {1, 1, 1}}),
    ?assertNotEqual(nomatch, binary:match(NoInput, <<"input 'b'">>)),
    ?assertMatch({error, {bad_args, _}}, kem:run(<<"add">>, #{a => Four, b => Four}, #{outputs => #{c => 4}})),
    ?assertMatch({error, {bad_args, _}}, kem:run(<<"add">>, #{a => 7}, #{})),
    ?assertMatch({error, {kernel_not_found, _}}, kem:run(<<"nope">>, #{a => Four}, #{workgroups => {1, 1, 1}})).
