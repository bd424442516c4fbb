%%% @doc The port boundary under many callers (docs/protocol.md, "Batch
%%% frames"): calls/s for 1 and 64 callers, a lone call's p50/p99, and what
%%% each call costs in CPU on both sides of the pipe: the port process (all
%%% threads, and its reader thread alone, from /proc) and the Erlang VM.
%%% kem and the echo port (tools/echo_port.py: same framing, no GPU) in the
%%% same run. `scripts/bench wire'.
-module(kem_wire_bench).
-export([run/1, profile/1, costs/0]).

-define(SMALL, <<1, 3, 5, 7>>).

%% @doc Seconds per rate measurement.
-spec run(pos_integer()) -> ok.
run(Seconds) ->
    {Echo, Kem, EchoCall} = setup(),
    %% Every port of the app (`ports', kem_place spreads many callers).
    port(<<"kem">>, Kem, [kem_port:os_pid(P) || P <- kem_sup:port_names()], Seconds),
    port(<<"echo">>, EchoCall, [kem_port:os_pid(Echo)], Seconds),
    stages(Kem, Seconds).

%% @doc Where the Erlang side's time goes at 64 callers (eprof, every
%% caller and port owner; `scripts/bench wire' does not run it): per
%% process kind and per module, in µs per call, for kem and the echo port.
%% eprof's tracing inflates every figure (a traced call costs ~1 µs), so
%% read the shares, not the sums; docs/benchmarks.md, "BEAM CPU per call".
-spec profile(pos_integer()) -> ok.
profile(Seconds) ->
    {Echo, Kem, EchoCall} = setup(),
    Owners = [whereis(P) || P <- kem_sup:port_names()],
    _ = rate(Kem, 64, 1),
    profiled(<<"kem">>, Kem, Owners, Seconds),
    profiled(<<"echo">>, EchoCall, [Echo], Seconds).

%% The app started and settled, the echo port started, and one small
%% `double' call through each (its answer checked) for the rates to loop.
setup() ->
    logger:set_primary_config(level, error),
    {ok, _} = application:ensure_all_started(kem),
    kem_bench:settle(),
    {ok, Echo} = kem_port:start_script(echo_tool()),
    Kem = fun() -> {ok, <<2, 6, 10, 14>>} = kem:call(execute_kernel, {<<"double">>, ?SMALL, 1}, 60000) end,
    EchoCall = fun() -> {ok, ?SMALL} = kem_port:call(Echo, execute_kernel, {<<"double">>, ?SMALL, 1}, 60000) end,
    {Echo, Kem, EchoCall}.

profiled(Name, Call, Owners, Seconds) ->
    {ok, _} = eprof:start(),
    profiling = eprof:start_profiling([self() | Owners], {'_', '_', '_'}, [set_on_spawn]),
    Calls = rate(Call, 64, Seconds) * Seconds,
    profiling_stopped = eprof:stop_profiling(),
    Data = eprof:dump(),
    stopped = eprof:stop(),
    PerCall = fun(Us) -> Us / Calls end,
    Side = fun(Pid) -> case lists:member(Pid, Owners) of true -> owner; false -> caller end end,
    BySide = sum_by(fun({Pid, _Mfa}) -> Side(Pid) end, Data),
    ByModule = sum_by(fun({Pid, {M, _, _}}) -> {Side(Pid), M} end, Data),
    ByFun = sum_by(fun({Pid, Mfa}) -> {Side(Pid), Mfa} end, Data),
    ok = io:format("~s under eprof, 64 callers: ~b calls; us per call by side: ~s~n",
                   [Name, round(Calls), [io_lib:format("~p ~.2f  ", [K, PerCall(V)]) || {K, V} <- BySide]]),
    ok = io:format("  by module: ~s~n", [[io_lib:format("~p:~p ~.2f  ", [S, M, PerCall(V)]) || {{S, M}, V} <- top(ByModule, 30)]]),
    [io:format("    ~p ~p:~p/~p ~.2f~n", [S, M, F, A, PerCall(V)]) || {{S, {M, F, A}}, V} <- top(ByFun, 45)],
    ok.

%% @doc What each step of a kem call costs alone, untraced, in one process
%% (ns per call, best of 3 runs of 200,000): the parts eprof names, without
%% eprof's overhead and without contention between schedulers.
-spec costs() -> [{atom(), float()}].
costs() ->
    logger:set_primary_config(level, error),
    {ok, _} = application:ensure_all_started(kem),
    Args = {<<"double">>, ?SMALL, 1},
    Self = self(),
    Steps = [{monotonic_time, fun() -> erlang:monotonic_time(microsecond) end},
             {app_get_env, fun() -> application:get_env(kem, shm_threshold, 1 bsl 20) end},
             {kem_args_call, fun() -> kem_args:call(execute_kernel, Args, 60000) end},
             {cluster_local_gpus, fun() -> kem_cluster:local_gpus() end},
             {quarantine_check, fun() -> kem_quarantine:check(<<"double">>) end},
             {place_pick_done, fun() -> {ok, I, _} = kem_place:pick(<<"double">>), kem_place:done(I, {ok, <<>>}, 100) end},
             {metrics_call_done, fun() -> kem_metrics:call_done(execute_kernel, {ok, <<>>}, 100, {4, 4}) end},
             {send_after_cancel, fun() -> erlang:cancel_timer(erlang:send_after(60000, Self, x), [{async, true}, {info, false}]) end},
             {monitor_demonitor, fun() -> erlang:demonitor(erlang:monitor(process, Self, [{alias, demonitor}]), [flush]) end},
             {warm_shape, fun() -> kem_warm:shape(execute_kernel, Args) end},
             {group_held, fun() -> kem_group:held(1, execute_kernel, Args, 60000) end},
             {term_to_binary, fun() -> term_to_binary({call, 1, execute_kernel, Args, 60000}) end},
             {shm_call_route, fun() -> kem_shm_dir:path() end}],
    Costs = [{Name, lists:min([loop_ns(Fun, 200000) || _ <- [1, 2, 3]])} || {Name, Fun} <- Steps],
    [io:format("  ~p ~b ns~n", [Name, round(Ns)]) || {Name, Ns} <- Costs],
    Costs.

loop_ns(Fun, N) ->
    T0 = erlang:monotonic_time(nanosecond),
    repeat(Fun, N),
    (erlang:monotonic_time(nanosecond) - T0) / N.

repeat(_Fun, 0) -> ok;
repeat(Fun, N) -> Fun(), repeat(Fun, N - 1).

sum_by(Key, Data) ->
    Sums = lists:foldl(fun({Pid, Funs}, Acc) ->
                           lists:foldl(fun({Mfa, {_Count, Us}}, A) -> maps:update_with(Key({Pid, Mfa}), fun(V) -> V + Us end, Us, A) end,
                                       Acc, Funs)
                       end, #{}, Data),
    lists:reverse(lists:keysort(2, maps:to_list(Sums))).

top(Sorted, N) -> lists:sublist(Sorted, N).

%% Where a batch's time goes at 64 callers, summed over every port: the
%% ports' own stage timers (wall µs, docs/executor.md) per batch, and how
%% long a call waited in the GPU queue.
stages(Call, Seconds) ->
    {ok, Before} = kem:stats(),
    _ = rate(Call, 64, Seconds),
    {ok, After} = kem:stats(),
    D = fun(Key) -> lists:sum([maps:get(Key, maps:get(P, After), 0) - maps:get(Key, maps:get(P, Before), 0)
                               || P <- maps:keys(After), is_map_key(P, Before)]) end,
    Batches = max(1, D(batches)),
    ok = io:format("kem stages at 64 callers: ~.1f calls a batch (~b calls ran inline); per batch us: upload+encode ~.1f, "
                   "submit ~.1f, gpu wait ~.1f, readback ~.1f; queue wait per call ~.1f us~n",
                   [D(batched_calls) / Batches, D(inline_calls), D(upload_encode_us) / Batches, D(submit_us) / Batches,
                    D(gpu_wait_us) / Batches, D(readback_us) / Batches, D(queue_wait_us) / max(1, D(batched_calls))]).

port(Name, Call, OsPids, Seconds) ->
    {P50, P99} = latency(Call, 2000),
    One = rate(Call, 1, Seconds),
    {Many, Cpu} = with_cpu(OsPids, fun() -> rate(Call, 64, Seconds) end),
    #{all := All, reader := Reader, vm := Vm, groups := Groups} = per_call(Cpu, Many * Seconds),
    ok = io:format("~s: lone call p50 ~b us p99 ~b us | 1 caller ~b calls/s | 64 callers ~b calls/s "
              "(~.1f% in group frames) | CPU per call at 64, ~b port(s) together: ~.1f us (readers ~.1f us), Erlang VM ~.1f us~n",
              [Name, P50, P99, round(One), round(Many), Groups * 100, length(OsPids), All, Reader, Vm]).

latency(Call, N) ->
    [Call() || _ <- lists:seq(1, 100)],
    Sorted = lists:sort([begin T = now_us(), Call(), now_us() - T end || _ <- lists:seq(1, N)]),
    {lists:nth(N div 2, Sorted), lists:nth(N * 99 div 100, Sorted)}.

%% kem_bench's caller loop; its calls take the small input, ours take none.
rate(Call, Callers, Seconds) ->
    kem_bench:rate(fun(_Small) -> Call() end, Callers, Seconds).

with_cpu(OsPids, Fun) ->
    Before = {all_threads(OsPids), vm_ms(), group_calls()},
    Result = Fun(),
    {Result, {Before, {all_threads(OsPids), vm_ms(), group_calls()}, OsPids}}.

per_call({{T0, V0, G0}, {T1, V1, G1}, OsPids}, Calls) ->
    Ticks = fun(M) -> lists:sum(maps:values(M)) end,
    Main = fun(M) -> lists:sum([maps:get(OsPid, M, 0) || OsPid <- OsPids]) end,
    Us = fun(TicksSpent) -> TicksSpent * 10000 / Calls end,  % 100 ticks a second
    #{all => Us(Ticks(T1) - Ticks(T0)), reader => Us(Main(T1) - Main(T0)), vm => (V1 - V0) * 1000 / Calls,
      groups => (G1 - G0) / Calls}.

%% Calls every port owner has sent inside group frames (kem_metrics).
group_calls() ->
    lists:sum([N || {{group_calls, _Owner}, N} <- kem_metrics:snapshot()]).

%% CPU ticks of every thread of these processes, by thread id (thread
%% ids are unique across processes).
all_threads(OsPids) ->
    lists:foldl(fun(P, Acc) -> maps:merge(Acc, threads(P)) end, #{}, OsPids).

%% CPU ticks (user + system) of each thread of OsPid; the main thread's id
%% is the process id (the port's reader thread).
threads(OsPid) ->
    Dir = "/proc/" ++ integer_to_list(OsPid) ++ "/task",
    {ok, Tids} = file:list_dir(Dir),
    maps:from_list([{list_to_integer(Tid), ticks(filename:join([Dir, Tid, "stat"]))} || Tid <- Tids]).

ticks(Path) ->
    case file:read_file(Path) of
        {ok, Stat} ->
            [_, After] = string:split(Stat, ")", trailing),
            Fields = string:lexemes(After, " "),
            binary_to_integer(lists:nth(12, Fields)) + binary_to_integer(lists:nth(13, Fields));
        _ -> 0
    end.

vm_ms() ->
    {Ms, _} = erlang:statistics(runtime),
    Ms.

now_us() -> erlang:monotonic_time(microsecond).

echo_tool() ->
    find_tool(filename:dirname(filename:absname(code:which(?MODULE)))).

find_tool(Dir) ->
    Candidate = filename:join([Dir, "tools", "echo_port.py"]),
    case filelib:is_regular(Candidate) of
        true -> Candidate;
        false when Dir =:= "/" -> error({tool_not_found, "echo_port.py"});
        false -> find_tool(filename:dirname(Dir))
    end.
