%%% @doc The benchmark behind scripts/bench: kem through its Erlang API
%%% against baselines measured in the same run (the original per-call
%%% design, and kem's transport with no GPU). Prints a table, writes JSON.
-module(kem_bench).
-export([run/2, rate/3, settle/0, run_coalesced/1, repo_tool/1]).

-define(DOUBLE, <<"double">>).
-define(SMALL, <<1, 3, 5, 7>>).

%% @doc Mode is quick (a 2-core machine) or full (a GPU node).
-spec run(quick | full, string()) -> ok.
run(Mode, OutFile) ->
    logger:set_primary_config(level, error),
    %% Sessions and chains (issue 29) first: kem runs for them alone with
    %% the session kernels' directory (kem_bench_sessions:in_bench/1).
    Sessions = kem_bench_sessions:in_bench(Mode),
    {ok, _} = application:ensure_all_started(kem),
    settle(),
    P = params(Mode),
    {ok, InfoJson} = kem:adapter_info(),
    {ok, Info} = kem_json:decode(InfoJson),
    Limit = maps:get(<<"max_storage_buffer_binding_size">>, maps:get(<<"limits">>, Info)),
    <<2, 6, 10, 14>> = kem_nif:execute_kernel(?DOUBLE, ?SMALL, 1),
    {ok, Echo} = kem_port:start_script(repo_tool("echo_port.py")),
    EchoCall = fun(Bin) -> {ok, _} = kem_port:call(Echo, execute_kernel, {?DOUBLE, Bin, 1}, 60000) end,
    KemCall = fun(Bin) -> {ok, _} = kem:call(execute_kernel, {?DOUBLE, Bin, 1}, 60000) end,
    {ok, Before} = kem:stats(),
    Small = latencies(fun() -> KemCall(?SMALL) end, maps:get(small_calls, P)),
    EchoSmall = latencies(fun() -> EchoCall(?SMALL) end, maps:get(small_calls, P)),
    %% The same kernel as a call by named buffers (kem:run/3, issue 25),
    %% against the kem@1.0 call moving the same bytes, in turn.
    Named = general_rows(KemCall, maps:get(small_calls, P)),
    {Rates, Groups} = lists:unzip([{{C, R}, {C, G}} || C <- [1, 8, 64],
                                                   {R, G} <- [grouped(fun() -> rate(KemCall, C, maps:get(seconds, P)) end)]]),
    EchoRates = [{C, rate(EchoCall, C, maps:get(seconds, P))} || C <- [1, 8, 64]],
    Sizes = [S || S <- maps:get(bulk_mb, P), S bsl 20 =< Limit],
    Bulk = [{S, bulk(KemCall, S, maps:get(bulk_reps, P))} || S <- Sizes],
    %% The same through the port pipe alone (side channel off).
    Threshold = application:get_env(kem, shm_threshold, 1 bsl 20),
    ok = application:set_env(kem, shm_threshold, infinity),
    BulkPipe = [{S, bulk(KemCall, S, maps:get(bulk_reps, P))} || S <- Sizes],
    ok = application:set_env(kem, shm_threshold, Threshold),
    EchoBulk = [{S, bulk(EchoCall, S, maps:get(bulk_reps, P))} || S <- Sizes],
    {ok, After} = kem:stats(),
    Seed = seed_design(maps:get(seed_calls, P)),
    SeedRate = maps:get(<<"calls_per_s">>, Seed),
    Coalesced = coalesced(P),
    Rate64 = proplists:get_value(64, Rates),
    Result = #{
        mode => Mode,
        adapter => maps:get(<<"name">>, Info),
        adapter_type => maps:get(<<"adapter_type">>, Info),
        ports => length(kem_sup:port_names()),
        small_p50_us => pct(Small, 50), small_p99_us => pct(Small, 99),
        echo_small_p50_us => pct(EchoSmall, 50), echo_small_p99_us => pct(EchoSmall, 99),
        calls_per_s => by_key(Rates), echo_calls_per_s => by_key(EchoRates), groups => by_key(Groups),
        seed_design_calls_per_s => SeedRate,
        seed_design_median_ms => maps:get(<<"median_ms">>, Seed),
        bulk_gbps => by_key(Bulk), bulk_pipe_gbps => by_key(BulkPipe), echo_bulk_gbps => by_key(EchoBulk),
        ratios => #{
            small_p50_over_echo => pct(Small, 50) / pct(EchoSmall, 50),
            calls_64_over_seed => Rate64 / SeedRate,
            bulk_64mb_over_echo => ratio(64, Bulk, EchoBulk)},
        coalesced => Coalesced,
        general => by_key(Named),
        sessions => Sessions,
        port_stats_delta => delta(Before, After)},
    ok = file:write_file(OutFile, kem_json:encode(Result)),
    print(Result, Sizes),
    print_coalesced(Coalesced),
    [io:format("  general call by named buffers (double, ~b B): p50 ~p us  p99 ~p us   | kem@1.0 call p50 ~p us  p99 ~p us~n",
               [B, maps:get(named_p50_us, R), maps:get(named_p99_us, R), maps:get(plain_p50_us, R), maps:get(plain_p99_us, R)])
     || {B, R} <- Named],
    kem_bench_sessions:print(Sessions),
    io:format("kem bench: wrote ~s~n", [OutFile]),
    ok.

%% @doc The coalesced rows alone (`scripts/bench coalesced [quick|full]`):
%% the same rows as run/2's `coalesced`, printed, for a quick look at calls
%% per dispatch and the share of calls that went in group frames.
-spec run_coalesced(quick | full) -> ok.
run_coalesced(Mode) ->
    logger:set_primary_config(level, error),
    {ok, _} = application:ensure_all_started(kem),
    settle(),
    print_coalesced(coalesced(params(Mode))).

params(quick) ->
    #{small_calls => 2000, seconds => 2, bulk_mb => [1, 16, 64], bulk_reps => 3, seed_calls => 20,
      coalesce_callers => [64], coalesce_words => [1, 64]};
params(full) ->
    #{small_calls => 5000, seconds => 3, bulk_mb => [1, 16, 64, 256], bulk_reps => 5, seed_calls => 20,
      coalesce_callers => [64, 256], coalesce_words => [1, 64, 256]}.

%% @doc Wait (at most 60 s) until every warm spare has started: a spare
%% opening its device and compiling the warm list beside the first rows
%% would be measured as their latency (seen as +60 us on a lone call's p50).
-spec settle() -> ok.
settle() ->
    settle(erlang:monotonic_time(millisecond) + 60000).

settle(Until) ->
    Starting = [S || #{stage := S} <- kem_spare:info(), S =/= ready],
    case Starting =/= [] andalso erlang:monotonic_time(millisecond) < Until of
        true -> timer:sleep(50), settle(Until);
        false -> ok
    end.

%% p50/p99 of a call by named buffers and of the kem@1.0 call with the same
%% bytes, at 4 B and 64 KiB, measured in alternating rounds of 100 calls.
general_rows(KemCall, N) ->
    [{Bytes, general_row(KemCall, binary:copy(<<1, 2, 3, 4>>, Bytes div 4), N)} || Bytes <- [4, 65536]].

general_row(KemCall, Bin, N) ->
    Words = byte_size(Bin) div 4,
    Run = fun() -> {ok, #{<<"output_words">> := _}} =
                       kem:run(?DOUBLE, #{<<"input_words">> => Bin}, #{outputs => #{output_words => byte_size(Bin)},
                                                                       grid => {Words, 1, 1}}) end,
    Run(),
    Rounds = max(1, N div 200),
    {Named0, Plain0} = lists:unzip([{latencies(Run, 100), latencies(fun() -> KemCall(Bin) end, 100)} || _ <- lists:seq(1, Rounds)]),
    {Named, Plain} = {lists:sort(lists:append(Named0)), lists:sort(lists:append(Plain0))},
    #{named_p50_us => pct(Named, 50), named_p99_us => pct(Named, 99), plain_p50_us => pct(Plain, 50), plain_p99_us => pct(Plain, 99)}.

latencies(Fun, N) ->
    [Fun() || _ <- lists:seq(1, 50)],  % warm: compile, pool
    lists:sort([begin T = now_us(), Fun(), now_us() - T end || _ <- lists:seq(1, N)]).

pct(Sorted, P) ->
    lists:nth(max(1, min(length(Sorted), round(length(Sorted) * P / 100))), Sorted).

%% Callers processes each calling in a loop for Seconds; total calls/s.
rate(Call, Callers, Seconds) ->
    Parent = self(),
    Deadline = now_us() + Seconds * 1000000,
    Pids = [spawn_link(fun() -> Parent ! {self(), loop(Call, Deadline, 0)} end) || _ <- lists:seq(1, Callers)],
    Started = now_us(),
    Total = lists:sum([receive {Pid, N} -> N end || Pid <- Pids]),
    Total / ((now_us() - Started) / 1.0e6).

loop(Call, Deadline, N) ->
    case now_us() < Deadline of
        true -> Call(?SMALL), loop(Call, Deadline, N + 1);
        false -> N
    end.

%% GB/s of payload for a round trip Erlang -> port -> GPU -> Erlang.
bulk(Call, MB, Reps) ->
    Bin = crypto:strong_rand_bytes(MB bsl 20),
    Call(Bin),
    Times = lists:sort([begin T = now_us(), Call(Bin), now_us() - T end || _ <- lists:seq(1, Reps)]),
    (MB bsl 20) / (lists:nth((Reps + 1) div 2, Times) / 1.0e6) / 1.0e9.

seed_design(Calls) ->
    Cmd = kem_port:python_executable() ++ " " ++ repo_tool("seed_design.py") ++ " " ++ integer_to_list(Calls) ++ " 2>/dev/null",
    Lines = string:split(string:trim(os:cmd(Cmd)), "\n", all),
    {ok, Map} = kem_json:decode(list_to_binary(lists:last(Lines))),
    Map.

%% A script of the repository's tools/ (not installed with the package),
%% found upward from this module: erlang/kem/tools holds only Erlang.
repo_tool(Name) ->
    find_tool(filename:dirname(filename:absname(code:which(?MODULE))), Name).

find_tool(Dir, Name) ->
    Candidate = filename:join([Dir, "tools", Name]),
    case filelib:is_regular(Candidate) of
        true -> Candidate;
        false when Dir =:= "/" -> error({tool_not_found, Name});
        false -> find_tool(filename:dirname(Dir), Name)
    end.

ratio(Key, A, B) ->
    case {proplists:get_value(Key, A), proplists:get_value(Key, B)} of
        {X, Y} when is_number(X), is_number(Y) -> X / Y;
        _ -> null
    end.

by_key(Pairs) -> maps:from_list([{integer_to_binary(K), V} || {K, V} <- Pairs]).

%% Fun's result, and how many kernel calls the node sent inside group
%% frames while it ran (kem_group), of how many kem counted (kem_metrics).
grouped(Fun) ->
    Before = kem_metrics:snapshot(),
    Result = Fun(),
    After = kem_metrics:snapshot(),
    Delta = fun(Tag) -> counted(Tag, After) - counted(Tag, Before) end,
    {Result, #{group_calls => Delta(group_calls), group_frames => Delta(group_frames),
               calls => Delta(calls), share => Delta(group_calls) / max(1, Delta(calls))}}.

counted(Tag, Snap) -> lists:sum([V || {{T, _}, V} <- Snap, T =:= Tag]).

delta(#{kem_port_1 := B}, #{kem_port_1 := A}) ->
    maps:from_list([{K, V - maps:get(K, B, 0)} || {K, V} <- maps:to_list(A), is_integer(V)]);
delta(_, _) -> #{}.

now_us() -> erlang:monotonic_time(microsecond).

%% Items/s through one coalesced dispatch (issue 14 items 2 and 6): Callers
%% processes call the packaged double_table kernel (the call-table ABI,
%% docs/dispatch.md: a batch's calls to it share one dispatch) with Words
%% 32-bit items each, and the plain double kernel the same way in the same
%% run as its baseline (one dispatch per call). Every reply is checked
%% against the input doubled in Erlang. Calls per dispatch come from the
%% ports' own stats (batched_calls / table_dispatches for double_table; 1
%% for double), and calls per batch (one submit) from batched_calls / batches.
-spec coalesced(map()) -> [map()].
coalesced(P) ->
    Seconds = maps:get(seconds, P),
    [coalesced_row(Kernel, Callers, Words, Seconds)
     || Callers <- maps:get(coalesce_callers, P), Words <- maps:get(coalesce_words, P),
        Kernel <- [<<"double_table">>, ?DOUBLE]].

coalesced_row(Kernel, Callers, Words, Seconds) ->
    Input = crypto:strong_rand_bytes(Words * 4),
    Want = doubled_words(Input),
    Call = fun(_) -> {ok, Want} = kem:call(execute_kernel, {Kernel, Input, 1}, 60000) end,
    [Call(x) || _ <- lists:seq(1, 20)],  % warm: compile, pool
    {ok, Before} = kem:stats(),
    {Rate, #{share := GroupShare}} = grouped(fun() -> rate(Call, Callers, Seconds) end),
    {ok, After} = kem:stats(),
    Count = fun(Key) -> summed(Key, After) - summed(Key, Before) end,
    Batches = Count(batches),
    Dispatches = case Kernel of
        ?DOUBLE -> Count(batched_calls);  % one dispatch per call
        _ -> Count(table_dispatches)
    end,
    #{kernel => Kernel, callers => Callers, words => Words, calls_per_s => Rate, items_per_s => Rate * Words,
      calls_per_dispatch => Count(batched_calls) / max(1, Dispatches),
      calls_per_batch => Count(batched_calls) / max(1, Batches), dispatches => Dispatches,
      group_share => GroupShare}.

%% Each 32-bit little-endian word doubled (mod 2^32), as both kernels do.
doubled_words(Bin) ->
    << <<((X * 2) band 16#FFFFFFFF):32/little>> || <<X:32/little>> <= Bin >>.

%% A counter summed over every port's stats.
summed(Key, StatsByPort) ->
    lists:sum([maps:get(Key, S, 0) || S <- maps:values(StatsByPort), is_map(S)]).

print_coalesced(Rows) ->
    io:format("  items/s through one coalesced dispatch (double_table vs plain double, same run):~n"),
    [io:format("    ~-12s ~3b callers x ~4b items: ~12.1f items/s  ~9.1f calls/s  ~6.1f calls/dispatch  ~6.1f calls/batch"
               "  ~5.1f% in groups~n",
               [K, C, W, I * 1.0, R * 1.0, D * 1.0, B * 1.0, G * 100])
     || #{kernel := K, callers := C, words := W, items_per_s := I, calls_per_s := R,
          calls_per_dispatch := D, calls_per_batch := B, group_share := G} <- Rows],
    ok.

print(R, Sizes) ->
    #{calls_per_s := C, echo_calls_per_s := EC, bulk_gbps := B, bulk_pipe_gbps := BP,
      echo_bulk_gbps := EB, ratios := Q} = R,
    io:format("~nkem bench (~p) on ~s (~s), ~b port(s)~n", [maps:get(mode, R), maps:get(adapter, R), maps:get(adapter_type, R), maps:get(ports, R)]),
    io:format("  small call (double, 4 B), one caller:  p50 ~p us  p99 ~p us   | echo p50 ~p us  p99 ~p us~n",
              [maps:get(small_p50_us, R), maps:get(small_p99_us, R),
               maps:get(echo_small_p50_us, R), maps:get(echo_small_p99_us, R)]),
    [io:format("  ~2b callers: ~9.1f calls/s  (~5.1f% in groups) | echo ~9.1f calls/s~n",
               [N, maps:get(integer_to_binary(N), C) * 1.0,
                maps:get(share, maps:get(integer_to_binary(N), maps:get(groups, R))) * 100,
                maps:get(integer_to_binary(N), EC) * 1.0]) || N <- [1, 8, 64]],
    io:format("  original per-call design: ~.1f calls/s (median ~.1f ms)~n",
              [maps:get(seed_design_calls_per_s, R) * 1.0, maps:get(seed_design_median_ms, R) * 1.0]),
    [io:format("  bulk ~3b MB: ~6.3f GB/s of payload (pipe alone ~6.3f) | echo ~6.3f GB/s~n",
               [S, maps:get(integer_to_binary(S), B), maps:get(integer_to_binary(S), BP),
                maps:get(integer_to_binary(S), EB)]) || S <- Sizes],
    io:format("  ratios: small p50 / echo p50 = ~.2f;  64 callers / original = ~.1fx;  bulk 64 MB / echo = ~p~n",
              [maps:get(small_p50_over_echo, Q), maps:get(calls_64_over_seed, Q), maps:get(bulk_64mb_over_echo, Q)]).
