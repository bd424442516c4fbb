%%% @doc The debug channel from Erlang: `kem:execute/3' with `debug => true'
%%% returns the records a kernel appended at @binding(15) beside the result.
-module(kem_debug_tests).
-include_lib("eunit/include/eunit.hrl").

-define(SEVENS, <<"
struct KemDebug { count: atomic<u32>, records: array<u32> }
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(15) var<storage, read_write> kem_debug: KemDebug;
fn kem_print(v: u32) {
    let i = atomicAdd(&kem_debug.count, 1u);
    if (i < arrayLength(&kem_debug.records)) { kem_debug.records[i] = v; }
}
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&output_words)) { return; }
    output_words[i] = input_words[i] * 2u;
    if (input_words[i] % 7u == 0u) { kem_print(i); }
}
">>).

debug_test_() ->
    {setup, fun start/0, fun stop/1,
     {timeout, 60, fun() ->
         Words = [rand:uniform(1 bsl 30) || _ <- lists:seq(1, 777)],
         Input = << <<W:32/little>> || W <- Words >>,
         {ok, Out, #{debug := Debug}} = kem:execute(<<"sevens">>, Input, #{debug => true}),
         ?assertEqual(<< <<(2 * W):32/little>> || W <- Words >>, Out),
         Expected = [I - 1 || {I, W} <- lists:zip(lists:seq(1, length(Words)), Words), W rem 7 =:= 0],
         ?assertMatch(#{dropped := 0, capacity := 4096}, Debug),
         ?assertEqual(Expected, lists:sort(maps:get(records, Debug))),
         %% Off unless asked: the same kernel without debug is refused.
         ?assertMatch({error, {bad_kernel, _}}, kem:execute(<<"sevens">>, Input, #{}))
     end}}.

start() ->
    kem_test_app:start_with_kernels("kem_debug", [{"sevens", ?SEVENS}], []).

stop(Started) ->
    kem_test_app:stop_with_kernels(Started).
