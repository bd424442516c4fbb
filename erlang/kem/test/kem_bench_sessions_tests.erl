%%% @doc The sessions and chains rows of scripts/bench (kem_bench_sessions,
%%% issue 29) with tiny repetition counts, on the real port: every row is
%%% there with positive figures, both copy chains moved their 64 KiB
%%% unchanged, the rows go into bench.json's encoding, and kem is left as it
%%% was found (stopped, as kem_bench:run/2 calls it, with its kernel_dir).
-module(kem_bench_sessions_tests).
-include_lib("eunit/include/eunit.hrl").

-define(ROWS, [small_call, resident_step_4kb, resident_step_big, chain_10, calls_10_in_turn,
               copy_step_chain, kernel_copy_chain]).

%% A run of a few seconds: 3 rounds of the small rows, 2 of the 1 MB
%% state's step, 2 callers for one 1 s window of each kind.
tiny() ->
    #{rounds => 3, big_rounds => 2, state_mb => 1, callers => 2, load_rounds => 1, load_seconds => 1}.

bench_sessions_test_() ->
    {setup, fun() -> kem_test_app:start([]) end, fun kem_test_app:stop/1,
     [{timeout, 120, fun rows_have_their_shape/0}]}.

rows_have_their_shape() ->
    Before = application:get_env(kem, kernel_dir),  % the .app's default: {ok, undefined}
    ?assertNotEqual({ok, kem_bench_sessions:kernel_dir()}, Before),
    %% As kem_bench:run/2 calls it: before kem is started.
    ok = application:stop(kem),
    R = kem_bench_sessions:in_bench(test, tiny()),
    ?assertNot(lists:keymember(kem, 1, application:which_applications())),
    #{rows := Rows, chains_under_load := Load, copy_chains := Copy, small_p50_us := Base} = R,
    ?assertEqual(lists:sort(?ROWS), lists:sort(maps:keys(Rows))),
    [begin
         #{p50_us := P50, p99_us := P99, x_small := X} = maps:get(Row, Rows),
         ?assert(is_integer(P50) andalso P50 > 0),
         ?assert(is_integer(P99) andalso P99 >= P50),
         ?assert(X > 0)
     end || Row <- ?ROWS],
    ?assertEqual(Base, maps:get(p50_us, maps:get(small_call, Rows))),
    ?assertEqual(1.0, maps:get(x_small, maps:get(small_call, Rows))),
    ?assertMatch(#{bytes := 65536, steps := 16, copy_steps_verified := true, kernel_copy_verified := true}, Copy),
    #{callers := 2, steps := 10, chains_per_s := CR, calls_equiv_per_s := CE, small_calls_per_s := SR,
      p50_us := LP50, p99_us := LP99} = Load,
    ?assert(CR > 0 andalso SR > 0 andalso LP50 > 0 andalso LP99 >= LP50),
    ?assertEqual(10 * CR, CE),
    %% As bench.json holds it.
    {ok, Json} = kem_json:decode(kem_json:encode(#{sessions => R})),
    #{<<"sessions">> := #{<<"rows">> := JsonRows, <<"copy_chains">> := #{<<"copy_steps_verified">> := true}}} = Json,
    ?assertEqual(lists:sort([atom_to_binary(A) || A <- ?ROWS]), lists:sort(maps:keys(JsonRows))),
    %% kem is left as it was: stopped, with its own kernel_dir, and starts
    %% again serving the packaged kernels.
    ?assertEqual(Before, application:get_env(kem, kernel_dir)),
    {ok, _} = application:ensure_all_started(kem),
    ?assertEqual({ok, <<2, 6, 10, 14>>}, kem:execute(<<"double">>, <<1, 3, 5, 7>>, #{})),
    ok = kem_bench_sessions:print(R).
