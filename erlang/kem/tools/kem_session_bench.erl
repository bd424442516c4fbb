%%% @doc The sessions benchmark from Erlang (scripts/bench_sessions): a
%%% resident step and a 10-step chain against same-run baselines, through
%%% the documented kem API. scripts/bench_sessions.py is the same from Python.
-module(kem_session_bench).
-export([run/3]).

-define(SMALL, <<1, 3, 5, 7>>).

%% @doc KernelDir holds accumulate.wgsl (tests/session_kernels).
-spec run(string(), pos_integer(), pos_integer()) -> ok.
run(KernelDir, StateMb, Reps) ->
    logger:set_primary_config(level, error),
    ok = application:load(kem),
    ok = application:set_env(kem, kernel_dir, KernelDir),
    {ok, _} = application:ensure_all_started(kem),
    {ok, InfoJson} = kem:adapter_info(),
    {ok, Info} = kem_json:decode(InfoJson),
    {ok, Big} = kem:session_open(#{}),
    ok = kem:buffer_create(Big, acc, StateMb bsl 20),
    {ok, Tiny} = kem:session_open(#{}),
    ok = kem:buffer_create(Tiny, acc, 4096),
    Step = fun(S) -> fun() -> {ok, <<>>} = kem:session_call(S, <<"accumulate">>, <<1:32/little>>, #{output_size => 0}) end end,
    Small = fun() -> {ok, _} = kem:execute(<<"double">>, ?SMALL, #{}) end,
    State = crypto:strong_rand_bytes(StateMb bsl 20),
    Ten = lists:duplicate(10, #{kernel => <<"double">>}),
    RoundTrip = fun() -> {ok, _} = kem:execute(<<"double">>, State, #{timeout => 120000}) end,
    %% Small and large rows are interleaved apart: right after a 64 MB
    %% step, lavapipe's small calls ran several times slower.
    Rows = interleaved([{"small call", Small, 1},
                        {"resident step (4 KB state, 4-byte call)", Step(Tiny), 1},
                        {"chain of 10 small steps", fun() -> {ok, _} = kem:chain(Ten, #{input => ?SMALL}) end, 1},
                        {"10 small calls in turn", fun() -> [Small() || _ <- lists:seq(1, 10)] end, 1}],
                       4 * Reps)
        ++ interleaved([{io_lib:format("resident step (~b MB state, 4-byte call)", [StateMb]), Step(Big), 1},
                        {io_lib:format("round trip (~b MB up and back)", [StateMb]), RoundTrip, 10}],
                       Reps),
    ok = kem:session_close(Big),
    ok = kem:session_close(Tiny),
    {_, Base} = hd(Rows),
    io:format("adapter: ~s (~s)~n~-48s ~10s ~9s ~13s~n",
              [maps:get(<<"name">>, Info), maps:get(<<"adapter_type">>, Info), "row", "median ms", "p90 ms", "x small call"]),
    [io:format("~-48s ~10.3f ~9.3f ~13.2f~n", [lists:flatten(Name), Med, P90, Med / element(1, Base)])
     || {Name, {Med, P90}} <- Rows],
    ok.

%% Rows are timed in rounds, one sample of each a round (a row with
%% Every = K only every K-th round), so a shared machine's load drifts over
%% all of them alike. Median and p90 in ms, after one untimed round.
interleaved(Rows, Rounds) ->
    Indexed = lists:zip(lists:seq(1, length(Rows)), Rows),
    [Fun() || {_, Fun, _} <- Rows],
    Samples = [{I, time_one(Fun)} || R <- lists:seq(0, Rounds - 1), {I, {_, Fun, Every}} <- Indexed, R rem Every =:= 0],
    [{Name, stats([Ms || {J, Ms} <- Samples, J =:= I])} || {I, {Name, _, _}} <- Indexed].

time_one(Fun) ->
    T0 = erlang:monotonic_time(microsecond),
    Fun(),
    (erlang:monotonic_time(microsecond) - T0) / 1000.

stats(Samples) ->
    Sorted = lists:sort(Samples),
    N = length(Sorted),
    {lists:nth(max(1, (N + 1) div 2), Sorted), lists:nth(max(1, (N * 9) div 10), Sorted)}.
