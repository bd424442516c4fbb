%%% @doc The sessions and chains rows of scripts/bench (issue 29, build
%%% item 5), run by kem_bench:run/2 in both modes: a resident step on a
%%% small and a large state, a chain of 10 small steps, many callers each
%%% running 10-step chains, and a chain that moves a buffer with copy steps
%%% against the same chain with a copy kernel. Every row is timed beside
%%% the same run's small call (kem:execute of double on 4 bytes), in
%%% interleaved rounds, and reported as p50, p99 and p50 over the small
%%% call's p50. docs/benchmarks.md, "Sessions and chains in scripts/bench",
%%% says what each row measures and the issue's targets.
-module(kem_bench_sessions).
-export([in_bench/1, in_bench/2, run/1, run/2, params/1, print/1, kernel_dir/0]).

-define(SMALL, <<1, 3, 5, 7>>).
-define(SMALL_DOUBLED, <<2, 6, 10, 14>>).
-define(COPY_BYTES, 65536).
-define(COPY_STEPS, 16).

%% @doc The rows inside kem_bench:run/2, which calls this before it starts
%% kem for its other rows: kem runs with `kernel_dir' at kernel_dir/0 for
%% these rows only, and is left as found (stopped, or restarted with its
%% own settings). Only these rows run with the extra directory: every lone
%% call stats `<dir>/double.wgsl' first (kem_port/port/lone_call.py: an
%% edited kernel takes effect at once), and the other rows stay measured as
%% they always were. Called first, kem starts once more in all (about 7 s
%% on the 2-core lavapipe machine: 4.5-5.5 s to start, 2-3 s for the warm
%% spares), not twice.
-spec in_bench(quick | full) -> map().
in_bench(Mode) ->
    in_bench(Mode, params(Mode)).

%% @doc in_bench/1 with explicit sizes and repetitions (as run/2's).
-spec in_bench(atom(), map()) -> map().
in_bench(Mode, P) ->
    _ = application:load(kem),
    Old = application:get_env(kem, kernel_dir),
    Running = lists:keymember(kem, 1, application:which_applications()),
    ok = stop(Running),
    ok = application:set_env(kem, kernel_dir, kernel_dir()),
    {ok, _} = application:ensure_all_started(kem),
    kem_bench:settle(),
    try run(Mode, P)
    after
        ok = application:stop(kem),
        ok = restore(Old),
        {ok, _} = started(Running)
    end.

stop(true) -> application:stop(kem);
stop(false) -> ok.

started(true) -> application:ensure_all_started(kem);
started(false) -> {ok, []}.

restore({ok, Dir}) -> application:set_env(kem, kernel_dir, Dir);
restore(undefined) -> application:unset_env(kem, kernel_dir).

%% @doc The rows with Mode's sizes and repetitions (params/1).
-spec run(quick | full) -> map().
run(Mode) ->
    run(Mode, params(Mode)).

%% @doc The rows with explicit sizes and repetitions: `rounds' (of the small
%% rows), `big_rounds', `state_mb', `callers', `load_rounds' and
%% `load_seconds' (each round one window of small calls and one of chains).
%% The kem application must be running with `kernel_dir' at kernel_dir/0
%% (kem_bench:run/2 restarts it so; the tests start it so).
-spec run(atom(), map()) -> map().
run(Mode, P) ->
    #{rounds := Rounds, big_rounds := BigRounds, state_mb := StateMb} = P,
    {ok, Tiny} = kem:session_open(#{}),
    {ok, Big} = kem:session_open(#{}),
    ok = kem:buffer_create(Tiny, acc, 4096),
    ok = kem:buffer_create(Big, acc, StateMb bsl 20),
    {CopySteps, CopyOk} = copy_chain(copy),
    {KernelSteps, KernelOk} = copy_chain(kernel),
    Ten = lists:duplicate(10, #{kernel => <<"double">>}),
    TenOut = ten_doubled(?SMALL),
    %% Small, copy and large rows are timed apart (as in kem_session_bench):
    %% right after a 64 MB step lavapipe's small calls ran several times
    %% slower, and right after a kernel-copy chain (16 x 64 KiB) the small
    %% call's p50 was 814 us against 422 us back to back.
    Small = interleaved([{small_call, fun small/0},
                         {resident_step_4kb, step(Tiny)},
                         {chain_10, fun() -> {ok, TenOut} = kem:chain(Ten, #{input => ?SMALL}) end},
                         {calls_10_in_turn, fun() -> [small() || _ <- lists:seq(1, 10)] end}], Rounds),
    Copies = interleaved([{copy_step_chain, CopySteps}, {kernel_copy_chain, KernelSteps}], Rounds),
    Large = interleaved([{resident_step_big, step(Big)}], BigRounds),
    %% Each resident step added 1 to every word: the states hold the count.
    true = resident_checked(Tiny, 4096, 1 + Rounds),
    true = resident_checked(Big, StateMb bsl 20, 1 + BigRounds),
    ok = kem:session_close(Tiny),
    ok = kem:session_close(Big),
    Base = p50(small_call, Small),
    Load = chains_under_load(P, Ten, TenOut, Base),
    #{mode => Mode, state_mb => StateMb, small_p50_us => Base,
      rows => maps:from_list([{Name, row(Us, Base)} || {Name, Us} <- Small ++ Copies ++ Large]),
      chains_under_load => Load,
      copy_chains => #{bytes => ?COPY_BYTES, steps => ?COPY_STEPS,
                       copy_steps_verified => CopyOk, kernel_copy_verified => KernelOk},
      targets => #{resident_step_x_small => 1.5, chain_10_x_small => 2.0, chains_per_s_64_callers => 10000}}.

%% Quick keeps a 2-core lavapipe machine at about 20 s for these rows: a
%% 4 MB state (64 MB is ~5 ms a step there and warms nothing useful) and 8
%% callers. Full is a GPU node's: the issue's 64 MB state and 64 callers.
-spec params(quick | full) -> map().
params(quick) ->
    #{rounds => 150, big_rounds => 40, state_mb => 4, callers => 8, load_rounds => 2, load_seconds => 1};
params(full) ->
    #{rounds => 1000, big_rounds => 300, state_mb => 64, callers => 64, load_rounds => 3, load_seconds => 2}.

%% @doc The directory holding the benchmark's kernels (accumulate.wgsl and
%% copy_words.wgsl): the tests' own tests/session_kernels, found upward
%% from this module's beam, so a clean checkout's scripts/bench finds it.
-spec kernel_dir() -> file:filename().
kernel_dir() ->
    find_up(filename:dirname(filename:absname(code:which(?MODULE)))).

find_up(Dir) ->
    Candidate = filename:join([Dir, "tests", "session_kernels"]),
    case filelib:is_regular(filename:join(Candidate, "accumulate.wgsl")) of
        true -> Candidate;
        false when Dir =:= "/" -> error({kernel_dir_not_found, "tests/session_kernels"});
        false -> find_up(filename:dirname(Dir))
    end.

%%% the rows

small() ->
    {ok, ?SMALL_DOUBLED} = kem:execute(<<"double">>, ?SMALL, #{}).

%% A 4-byte call that only changes state: accumulate adds the input word to
%% every word of the session's `acc' and returns nothing.
step(Session) ->
    fun() -> {ok, <<>>} = kem:session_call(Session, <<"accumulate">>, <<1:32/little>>, #{output_size => 0}) end.

resident_checked(Session, Bytes, Count) ->
    {ok, Acc} = kem:buffer_read(Session, acc),
    Acc =:= binary:copy(<<Count:32/little>>, Bytes div 4).

%% The input word doubled ten times (mod 2^32), as the 10-step chain does.
ten_doubled(<<W:32/little>>) ->
    <<((W bsl 10) band 16#FFFFFFFF):32/little>>.

%% A session with buffers b0 (64 KiB of random bytes) to b16 (zeros) and a
%% 4-byte `tick', and a timed fun that moves b0 along to b16 in 16 steps,
%% one buffer to the next: by copy steps (the GPU's copy command) or by the
%% copy_words kernel (what a chain needed before copy steps). The first run
%% returns b16, which must equal b0's bytes: every step ran, in order. The
%% timed runs return `tick' (4 bytes), so both rows read back alike.
copy_chain(How) ->
    {ok, S} = kem:session_open(#{}),
    Data = crypto:strong_rand_bytes(?COPY_BYTES),
    ok = kem:buffer_create(S, buf(0), Data),
    [ok = kem:buffer_create(S, buf(I), ?COPY_BYTES) || I <- lists:seq(1, ?COPY_STEPS)],
    ok = kem:buffer_create(S, tick, 4),
    Steps = [copy_step(How, buf(I - 1), buf(I)) || I <- lists:seq(1, ?COPY_STEPS)],
    Last = buf(?COPY_STEPS),
    {ok, #{Last := Moved}} = kem:chain(Steps, #{session => S, return => [Last]}),
    {fun() -> {ok, #{<<"tick">> := _}} = kem:chain(Steps, #{session => S, return => [tick]}) end, Moved =:= Data}.

copy_step(copy, From, To) -> #{copy => {From, 0, To, 0, ?COPY_BYTES}};
copy_step(kernel, From, To) -> #{kernel => <<"copy_words">>, input => From, output => To}.

buf(I) -> <<"b", (integer_to_binary(I))/binary>>.

%% Callers processes, each running 10-step chains for a window, against a
%% window of the same callers making small calls, alternated load_rounds
%% times in one sitting. Chains/s, what that is in calls (10 each), the
%% small calls' calls/s, and the chains' latency under that load.
chains_under_load(P, Ten, TenOut, Base) ->
    #{callers := Callers, load_rounds := Rounds, load_seconds := Seconds} = P,
    Chain = fun() -> {ok, TenOut} = kem:chain(Ten, #{input => ?SMALL}) end,
    Windows = [{load(fun small/0, Callers, Seconds), load(Chain, Callers, Seconds)} || _ <- lists:seq(1, Rounds)],
    {SmallWins, ChainWins} = lists:unzip(Windows),
    ChainRate = per_s(ChainWins),
    SmallRate = per_s(SmallWins),
    Lat = lists:sort(lists:append([L || {_, _, L} <- ChainWins])),
    #{callers => Callers, steps => 10, seconds => Rounds * Seconds,
      chains_per_s => ChainRate, calls_equiv_per_s => 10 * ChainRate, small_calls_per_s => SmallRate,
      calls_equiv_over_small_calls => 10 * ChainRate / SmallRate,
      p50_us => pct(Lat, 50), p99_us => pct(Lat, 99), x_small => pct(Lat, 50) / Base}.

per_s(Windows) ->
    lists:sum([N || {N, _, _} <- Windows]) / lists:sum([S || {_, S, _} <- Windows]).

%% Callers processes calling Fun until a deadline: {calls, seconds, latencies}.
load(Fun, Callers, Seconds) ->
    [Fun() || _ <- lists:seq(1, Callers)],  % warm: pool, pipelines
    Parent = self(),
    Deadline = now_us() + Seconds * 1000000,
    Started = now_us(),
    Pids = [spawn_link(fun() -> Parent ! {self(), timed_loop(Fun, Deadline, [])} end) || _ <- lists:seq(1, Callers)],
    Lats = lists:append([receive {Pid, L} -> L end || Pid <- Pids]),
    {length(Lats), (now_us() - Started) / 1.0e6, Lats}.

timed_loop(Fun, Deadline, Acc) ->
    case now_us() of
        T when T < Deadline -> Fun(), timed_loop(Fun, Deadline, [now_us() - T | Acc]);
        _ -> Acc
    end.

%% Rows timed in rounds, one sample of each a round, so a shared machine's
%% load drifts over all of them alike; one untimed round first (compile,
%% pool). Sorted microseconds a row.
interleaved(Rows, Rounds) ->
    [Fun() || {_, Fun} <- Rows],
    Samples = [[time_one(Fun) || {_, Fun} <- Rows] || _ <- lists:seq(1, Rounds)],
    Columns = transpose(Samples),
    [{Name, lists:sort(Col)} || {{Name, _}, Col} <- lists:zip(Rows, Columns)].

transpose([[] | _]) -> [];
transpose(Rows) -> [[H || [H | _] <- Rows] | transpose([T || [_ | T] <- Rows])].

time_one(Fun) ->
    T0 = now_us(),
    Fun(),
    now_us() - T0.

row(Sorted, Base) ->
    #{p50_us => pct(Sorted, 50), p99_us => pct(Sorted, 99), x_small => pct(Sorted, 50) / Base}.

p50(Name, Rows) -> pct(proplists:get_value(Name, Rows), 50).

pct(Sorted, P) ->
    lists:nth(max(1, min(length(Sorted), round(length(Sorted) * P / 100))), Sorted).

now_us() -> erlang:monotonic_time(microsecond).

%%% the table

%% @doc The rows as a table, in the order docs/benchmarks.md lists them.
-spec print(map()) -> ok.
print(#{rows := Rows, chains_under_load := L, copy_chains := C, state_mb := Mb}) ->
    io:format("  sessions and chains (issue 29), each row's p50 over the same run's small call p50:~n"
              "    ~-46s ~9s ~9s ~8s~n", ["row", "p50 us", "p99 us", "x small"]),
    [begin
         #{p50_us := P50, p99_us := P99, x_small := X} = maps:get(Key, Rows),
         io:format("    ~-46s ~9b ~9b ~8.2f~n", [Label, P50, P99, X])
     end || {Key, Label} <- labels(Mb)],
    #{callers := N, chains_per_s := CR, calls_equiv_per_s := CE, small_calls_per_s := SR,
      p50_us := LP50, p99_us := LP99} = L,
    io:format("    ~b callers x 10-step chains: ~.1f chains/s (~.1f calls-equivalent/s) | small calls ~.1f calls/s;"
              " chain p50 ~b us  p99 ~b us under load~n", [N, CR * 1.0, CE * 1.0, SR * 1.0, LP50, LP99]),
    io:format("    copy chains (~b steps of ~b B): results checked equal to the input: copy steps ~p, copy kernel ~p~n",
              [maps:get(steps, C), maps:get(bytes, C), maps:get(copy_steps_verified, C), maps:get(kernel_copy_verified, C)]).

labels(Mb) ->
    [{small_call, "small call (double, 4 B): the baseline"},
     {resident_step_4kb, "resident step (4 KB state, 4-byte call)"},
     {resident_step_big, lists:flatten(io_lib:format("resident step (~b MB state, 4-byte call)", [Mb]))},
     {chain_10, "chain of 10 small steps"},
     {calls_10_in_turn, "10 small calls in turn"},
     {copy_step_chain, "copy-step chain (16 x 64 KiB)"},
     {kernel_copy_chain, "kernel-copy chain (16 x 64 KiB)"}].
