%%% @doc Red team of kem:run/3 (issue 25) through the real port: hostile
%%% terms from an Erlang caller (pids, refs, funs and nested maps as buffer
%%% names, values or options) are each refused with a reason, and the app
%%% and its port keep answering.
-module(kem_red_team_named_tests).
-include_lib("eunit/include/eunit.hrl").

-define(ADD, <<"@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> c: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&c)) { c[i] = a[i] + 1u; }
}
">>).

hostile_test_() ->
    {setup,
     fun() -> kem_test_app:start_with_kernels("red_named", [{"inc", ?ADD}], []) end,
     fun kem_test_app:stop_with_kernels/1,
     [{timeout, 60, fun hostile_terms_are_refused_and_the_port_lives/0}]}.

hostile_terms_are_refused_and_the_port_lives() ->
    Ok = #{outputs => #{c => 4}, workgroups => {1, 1, 1}},
    ?assertEqual({ok, #{<<"c">> => <<2:32/little>>}}, kem:run(<<"inc">>, #{a => <<1:32/little>>}, Ok)),
    Fun = fun() -> ok end,
    Cases = [{#{self() => <<1:32>>}, Ok},
             {#{make_ref() => <<1:32>>}, Ok},
             {#{Fun => <<1:32>>}, Ok},
             {#{{a} => <<1:32>>}, Ok},
             {#{[$a] => <<1:32>>}, Ok},
             {#{a => <<1:32>>}, Ok#{outputs => #{c => self()}}},
             {#{a => <<1:32>>}, Ok#{outputs => #{self() => 4}}},
             {#{a => <<1:32>>}, Ok#{outputs => [{c, 4}]}},
             {#{a => <<1:32>>}, Ok#{workgroups => [1, 1, 1]}},
             {#{a => <<1:32>>}, Ok#{entry_point => Fun}},
             {#{a => <<1:32>>}, Ok#{constants => #{make_ref() => 1}}},
             {#{a => <<1:32>>, <<"a">> => <<1:32>>}, Ok},
             {#{a => <<1:32>>, 0 => <<1:32>>}, Ok},
             {#{a => <<1:32>>}, Ok#{outputs => #{c => 1 bsl 70}}},
             {#{a => <<1:32>>}, Ok#{grid => {1, 1, 1}}},
             {#{a => <<1:32>>}, Ok#{timeout => infinity, outputs => #{c => -1}}}],
    lists:foreach(
        fun({Buffers, Opts}) ->
            Got = kem:run(<<"inc">>, Buffers, Opts),
            ?assertMatch({error, {R, D}} when (R =:= bad_args orelse R =:= too_large) andalso is_binary(D), Got),
            {error, {_, Detail}} = Got,
            ?assertEqual(nomatch, binary:match(Detail, [<<"OtpErlang">>, <<"Traceback">>, <<"/home">>, <<"/work">>]))
        end, Cases),
    ?assertEqual({ok, #{<<"c">> => <<2:32/little>>}}, kem:run(<<"inc">>, #{a => <<1:32/little>>}, Ok)).
