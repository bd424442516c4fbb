%%% @doc Red team of the operators' dashboard's recorder (docs/dashboard.md),
%%% the real `kem_dashboard_stats' server and table: a stranger's endless
%%% distinct kernel ids, ids of a megabyte, and chains of any length do not
%%% grow the table past its cap (held: nothing to fix).
-module(kem_red_team_faces_tests).
-include_lib("eunit/include/eunit.hrl").

-define(T, kem_dashboard_stats).

recorder_stays_bounded_test_() ->
    {setup, fun start/0, fun stop/1, {timeout, 120, fun distinct_ids_do_not_grow_the_table/0}}.

start() ->
    {ok, Pid} = kem_dashboard_stats:start_link(),
    unlink(Pid),
    Pid.

stop(Pid) ->
    exit(Pid, shutdown).

distinct_ids_do_not_grow_the_table() ->
    Max = kem_dashboard_stats:max_kernels(),
    Ok = fun(Id) -> kem_dashboard_stats:call_done(Id, {ok, <<>>}, rand:uniform(100000)) end,
    %% 20,000 distinct ids that all succeed (a stranger's own kernels), then
    %% 200 ids of 1 MiB each and chains of 1 to 2,000 kernels.
    [Ok(<<"k", (integer_to_binary(I))/binary>>) || I <- lists:seq(1, 20000)],
    Big = binary:copy(<<"x">>, 1 bsl 20),
    [Ok(<<Big/binary, (integer_to_binary(I))/binary>>) || I <- lists:seq(1, 200)],
    [Ok(iolist_to_binary(lists:join(<<",">>, lists:duplicate(N, <<"double">>)))) || N <- lists:seq(1, 2000)],
    %% Failed calls of made-up ids with every error reason kem has never take a place.
    [kem_dashboard_stats:call_done(<<"nope", (integer_to_binary(I))/binary>>, {error, {kernel_not_found, <<>>}}, 5)
     || I <- lists:seq(1, 5000)],
    #{kernels := Kernels} = kem_dashboard_stats:window(),
    Named = [K || #{kernel := K} <- Kernels, K =/= other],
    ?assertEqual(Max, length(Named)),
    ?assertEqual(Max, ets:select_count(?T, [{{{t, '_'}}, [], [true]}])),
    ?assert(lists:all(fun(K) -> byte_size(K) =< 256 end, Named)),
    [Other] = [C || #{kernel := other, calls := C} <- Kernels],
    ?assertEqual(20000 + 200 + 2000 + 5000 - Max, Other),
    %% The table: per slot one row per tracked kernel, `other', the error
    %% reason; at most two slots were used here. Words: far below 1.4 MB.
    Rows = ets:info(?T, size),
    ?assert(Rows =< 2 * (Max + 1) + Max + 4),
    ?assert(ets:info(?T, memory) * erlang:system_info(wordsize) < 1400000),
    %% A later window drops it all and gives the places back.
    ok = kem_dashboard_stats:prune(kem_dashboard_stats:slot() + kem_dashboard_stats:window_slots() + 1),
    ?assertEqual(0, ets:select_count(?T, [{{{t, '_'}}, [], [true]}])).
