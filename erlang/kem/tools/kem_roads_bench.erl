%%% @doc The roads of this wave side by side, from Erlang, in one run
%%% (`scripts/bench roads [seconds]'): a kem@1.0 call, a call by named
%%% buffers (4 B and 64 KiB, against the kem@1.0 call moving the same
%%% bytes), a resident session step and a chain of 10, each row's p50 over
%%% the same run's small call, rows interleaved in rounds; then calls or
%%% chains per second from 64 callers (kem@1.0 calls before and after, as
%%% the run's baseline). Figures: docs/benchmarks.md, "Roads side by side".
-module(kem_roads_bench).
-export([run/1]).

-define(D, <<"double">>).
-define(SMALL, <<1, 3, 5, 7>>).

-spec run(number()) -> ok.
run(Seconds) ->
    logger:set_primary_config(level, error),
    ok = application:load(kem),
    ok = application:set_env(kem, kernel_dir, kem_bench_sessions:kernel_dir()),  % accumulate.wgsl
    {ok, _} = application:ensure_all_started(kem),
    kem_bench:settle(),
    {ok, S} = kem:session_open(#{}),
    ok = kem:buffer_create(S, acc, 4096),
    Big = binary:copy(<<1, 2, 3, 4>>, 16384),
    Rows = [{"small call (kem@1.0, 4 B)", plain(?SMALL)}, {"named call (4 B)", named(?SMALL)},
            {"kem@1.0 call (64 KiB)", plain(Big)}, {"named call (64 KiB)", named(Big)},
            {"resident step (4 KB state, 4 B call)", step(S)}, {"chain of 10 small steps", chain()}],
    [F() || {_, F} <- Rows, _ <- lists:seq(1, 50)],  % compiled, kits built
    Latencies = interleaved(Rows, 10, 100),
    {_, Base, _} = hd(Latencies),
    io:format("~-40s ~8s ~8s ~8s~n", ["row", "p50 us", "p99 us", "x small"]),
    [io:format("~-40s ~8b ~8b ~8.2f~n", [Name, P50, P99, P50 / Base]) || {Name, P50, P99} <- Latencies],
    Rates = [{"kem@1.0 calls", plain(?SMALL)}, {"named calls", named(?SMALL)}, {"10-step chains", chain()},
             {"kem@1.0 calls, again", plain(?SMALL)}],
    [io:format("64 callers, ~-22s ~10.1f /s~n", [Name, kem_bench:rate(fun(_) -> F() end, 64, Seconds)]) || {Name, F} <- Rates],
    ok = kem:session_close(S).

plain(Bin) -> fun() -> {ok, _} = kem:call(execute_kernel, {?D, Bin, 1}, 60000) end.

named(Bin) ->
    Words = byte_size(Bin) div 4,
    fun() -> {ok, #{<<"output_words">> := _}} =
                 kem:run(?D, #{<<"input_words">> => Bin}, #{outputs => #{output_words => byte_size(Bin)}, grid => {Words, 1, 1}})
    end.

step(S) -> fun() -> {ok, <<>>} = kem:session_call(S, <<"accumulate">>, <<1:32/little>>, #{output_size => 0}) end.

chain() ->
    Ten = lists:duplicate(10, #{kernel => ?D}),
    fun() -> {ok, _} = kem:chain(Ten, #{input => ?SMALL}) end.

%% Rounds of N calls of each row in turn: a drift of the host is in every row alike.
interleaved(Rows, Rounds, N) ->
    Samples = lists:foldl(fun(_, Acc) -> [{Name, latencies(F, N) ++ proplists:get_value(Name, Acc, [])} || {Name, F} <- Rows] end,
                          [], lists:seq(1, Rounds)),
    [begin Sorted = lists:sort(proplists:get_value(Name, Samples)), {Name, pct(Sorted, 50), pct(Sorted, 99)} end
     || {Name, _} <- Rows].

latencies(F, N) ->
    [begin T = erlang:monotonic_time(microsecond), F(), erlang:monotonic_time(microsecond) - T end || _ <- lists:seq(1, N)].

pct(Sorted, P) -> lists:nth(max(1, min(length(Sorted), round(length(Sorted) * P / 100))), Sorted).
