%%% @doc `grid' and `constants' from Erlang (issue 25): `kem:execute/3'
%%% runs a 2-D matmul with a grid of its output's shape and kernels with
%%% `override' constants, against values computed here on fresh random
%%% integers (exact in f32); kem_args refuses malformed options before a
%%% frame is made, and the port refuses what only the kernel can tell.
-module(kem_grid_constants_tests).
-include_lib("eunit/include/eunit.hrl").

-define(MATMUL, <<"
struct Dims { m: u32, k: u32, n: u32 }
@group(0) @binding(0) var<storage, read> ab: array<f32>;
@group(0) @binding(1) var<storage, read_write> c: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    let row = gid.y;
    if (row >= dims.m || col >= dims.n) { return; }
    var sum = 0.0;
    let b0 = dims.m * dims.k;
    for (var i = 0u; i < dims.k; i = i + 1u) {
        sum = sum + ab[row * dims.k + i] * ab[b0 + i * dims.n + col];
    }
    c[row * dims.n + col] = sum;
}
">>).

-define(SCALED, <<"
override SCALE: f32;
@id(7) override BIAS: f32 = 0.5;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&b)) { return; }
    b[i] = a[i] * SCALE + BIAS;
}
">>).

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

grid_constants_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 120, fun matmul_with_a_grid/0},
      {timeout, 60, fun grid_refusals/0},
      {timeout, 60, fun constants_in_the_arithmetic/0},
      {timeout, 60, fun an_override_sized_workgroup/0},
      {timeout, 60, fun constants_refusals/0}]}.

kem_args_refusals_test() ->
    Bad = fun(Opts) -> element(1, element(2, kem_args:execute_opts(Opts))) end,
    ?assertEqual(bad_args, Bad(#{grid => {8, 8}})),
    ?assertEqual(bad_args, Bad(#{grid => {0, 1, 1}})),
    ?assertEqual(bad_args, Bad(#{grid => {1 bsl 33, 1, 1}})),
    ?assertMatch({error, {bad_args, <<"give grid (invocations) or workgroups, not both">>}},
                 kem_args:execute_opts(#{grid => {8, 8, 1}, workgroups => {1, 1, 1}})),
    ?assertEqual(bad_args, Bad(#{constants => [{<<"SCALE">>, 1.0}]})),
    ?assertEqual(bad_args, Bad(#{constants => #{<<"SCALE">> => <<"1">>}})),
    ?assertEqual(bad_args, Bad(#{constants => #{1 => 2.0}})),
    ?assertEqual(bad_args, Bad(#{constants => #{true => 2.0}})),
    ?assertEqual(bad_args, Bad(#{constants => #{'S' => 1 bsl 65}})),
    Many = maps:from_list([{list_to_atom("c" ++ integer_to_list(I)), I} || I <- lists:seq(1, 65)]),
    ?assertEqual(too_large, Bad(#{constants => Many})),
    ?assertMatch({ok, default, infinity, false, _},
                 kem_args:execute_opts(#{grid => {64, 48, 1}, constants => #{'SCALE' => 2.5, <<"BIAS">> => 1}})).

matmul_with_a_grid() ->
    [begin
         A = ints(M * K), B = ints(K * N),
         Opts = #{params => <<M:32/little, K:32/little, N:32/little, 0:32>>, grid => {N, M, 1},
                  output_size => M * N * 4},
         {ok, Out} = kem:execute(<<"matmul">>, floats(A ++ B), Opts),
         ?assertEqual(floats(matmul(A, B, M, K, N)), Out)
     end || {M, K, N} <- [{8, 8, 8}, {17, 5, 33}, {1, 9, 70}]].

grid_refusals() ->
    Params = <<8:32/little, 8:32/little, 8:32/little, 0:32>>,
    ?assertMatch({error, {bad_args, _}},
                 kem:execute(<<"matmul">>, <<0:4096>>, #{params => Params, grid => {8, 8, 1}, workgroups => {1, 1, 1}})),
    %% 65535 * 8 + 1 invocations in x need 65536 workgroups of 8: over the device's limit.
    {error, {too_large, Detail}} =
        kem:execute(<<"matmul">>, <<0:4096>>, #{params => Params, grid => {65535 * 8 + 1, 1, 1}, output_size => 256}),
    ?assertNotEqual(nomatch, binary:match(Detail, <<"65536">>)).

constants_in_the_arithmetic() ->
    A = ints(333),
    {ok, Out} = kem:execute(<<"scaled">>, floats(A), #{constants => #{'SCALE' => 2.5}}),
    ?assertEqual(floats([X * 2.5 + 0.5 || X <- A]), Out),
    %% Two constant sets alternating: each call on its own pipeline.
    [begin
         {ok, Got} = kem:execute(<<"scaled">>, floats(A), #{constants => #{<<"SCALE">> => S, 'BIAS' => -1}}),
         ?assertEqual(floats([X * S - 1 || X <- A]), Got)
     end || S <- [2, 3, 2, 3, -1]].

an_override_sized_workgroup() ->
    [begin
         A = ints(Count),
         {ok, Default} = kem:execute(<<"sized">>, floats(A), #{output_size_hint => 2}),
         ?assertEqual(pairs(A, (Count + 63) div 64), Default),
         {ok, Small} = kem:execute(<<"sized">>, floats(A), #{output_size_hint => 2, constants => #{'WG' => 16}}),
         ?assertEqual(pairs(A, (Count + 15) div 16), Small)
     end || Count <- [1, 64, 65, 1000]].

constants_refusals() ->
    {error, {bad_args, Missing}} = kem:execute(<<"scaled">>, <<0:256>>, #{}),
    ?assertNotEqual(nomatch, binary:match(Missing, <<"SCALE">>)),
    {error, {bad_args, Unknown}} = kem:execute(<<"scaled">>, <<0:256>>, #{constants => #{'SCALE' => 1, 'SCALF' => 2}}),
    ?assertNotEqual(nomatch, binary:match(Unknown, <<"SCALF">>)),
    {error, {bad_args, Range}} = kem:execute(<<"sized">>, <<0:256>>, #{constants => #{'WG' => -1}}),
    ?assertNotEqual(nomatch, binary:match(Range, <<"u32">>)).

%%% helpers

ints(N) -> [rand:uniform(101) - 51 || _ <- lists:seq(1, N)].

floats(Xs) -> << <<X:32/float-little>> || X <- Xs >>.

pairs(Xs, Groups) -> << <<(2 * X):32/float-little, Groups:32/float-little>> || X <- Xs >>.

matmul(A, B, M, K, N) ->
    At = list_to_tuple(A), Bt = list_to_tuple(B),
    [lists:sum([element(R * K + I + 1, At) * element(I * N + C + 1, Bt) || I <- lists:seq(0, K - 1)])
     || R <- lists:seq(0, M - 1), C <- lists:seq(0, N - 1)].

start() ->
    kem_test_app:start_with_kernels("kem_grid", [{"matmul", ?MATMUL}, {"scaled", ?SCALED}, {"sized", ?SIZED}], []).

stop(Started) ->
    kem_test_app:stop_with_kernels(Started).
