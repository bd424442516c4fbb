%%% @doc How small calls scale with callers and GPUs (issue 29, item 4):
%%% calls/s at 8, 64 and 256 callers, each row beside the same run's echo
%%% ports (one per kem port: the transport's ceiling), with the share of each
%%% port, the schedulers' utilisation and the BEAM's CPU per call measured
%%% during the row. Run it once per adapter setting (`-kem adapters '[0]'`,
%%% then `'[0,1]'`) on one machine to get the 1- and 2-GPU curves.
-module(kem_scale_bench).
-export([run/2]).

-define(SMALL, <<1, 3, 5, 7>>).

%% @doc Rows at 8/64/256 callers, Seconds each; prints them and writes JSON.
-spec run(string(), pos_integer()) -> ok.
run(OutFile, Seconds) ->
    logger:set_primary_config(level, error),
    {ok, _} = application:ensure_all_started(kem),
    kem_bench:settle(),
    Ports = kem_sup:port_names(),
    KemCall = fun(Bin) -> {ok, _} = kem:call(execute_kernel, {<<"double">>, Bin, 1}, 60000) end,
    [KemCall(?SMALL) || _ <- lists:seq(1, 200)],
    Echoes = [begin {ok, E} = kem_port:start_script(kem_bench:repo_tool("echo_port.py")), E end || _ <- Ports],
    EchoCall = echo_call(list_to_tuple(Echoes)),
    erlang:system_flag(scheduler_wall_time, true),
    Rows = [row(C, Seconds, KemCall, EchoCall) || C <- [8, 64, 256]],
    Result = #{ports => length(Ports), schedulers => erlang:system_info(schedulers_online), rows => Rows},
    ok = file:write_file(OutFile, kem_json:encode(Result)),
    [io:format("~4b callers: kem ~8b calls/s (BEAM ~5.1f us/call, util ~5.1f%, share ~w%, port CPU ~w%) | echo ~8b calls/s (BEAM ~5.1f us/call)~n",
               [C, round(K), KCpu, KUtil, Share, PortCpu, round(E), ECpu])
     || #{callers := C, kem_calls_per_s := K, kem_beam_us_per_call := KCpu, kem_util_pct := KUtil, port_cpu_pct := PortCpu,
          port_share := Share, echo_calls_per_s := E, echo_beam_us_per_call := ECpu} <- Rows],
    ok.

%% Echo ports taken in turn by a per-process counter, as kem spreads callers.
echo_call(Echoes) ->
    fun(Bin) ->
        N = case get(kem_scale_echo) of undefined -> erlang:phash2(self(), tuple_size(Echoes)); I -> I end,
        put(kem_scale_echo, (N + 1) rem tuple_size(Echoes)),
        {ok, _} = kem_port:call(element(N + 1, Echoes), execute_kernel, {<<"double">>, Bin, 1}, 60000)
    end.

row(Callers, Seconds, KemCall, EchoCall) ->
    {ok, Before} = kem:stats(),
    Cpu0 = port_cpu(),
    {K, KBusy} = busy(fun() -> kem_bench:rate(KemCall, Callers, Seconds) end),
    Cpu1 = port_cpu(),
    {ok, After} = kem:stats(),
    {E, EBusy} = busy(fun() -> kem_bench:rate(EchoCall, Callers, Seconds) end),
    #{callers => Callers, kem_calls_per_s => K, echo_calls_per_s => E,
      kem_beam_us_per_call => KBusy / (K * Seconds), echo_beam_us_per_call => EBusy / (E * Seconds),
      kem_util_pct => 100 * KBusy / (Seconds * 1.0e6 * erlang:system_info(schedulers_online)),
      port_share => share(Before, After),
      port_cpu_pct => [round(100 * (B - A) / (Seconds * ticks())) || {A, B} <- lists:zip(Cpu0, Cpu1)]}.

%% Each kem port process's user+system CPU so far, in clock ticks
%% (/proc/PID/stat fields 14 and 15): is a port's Python the limit?
port_cpu() ->
    [proc_ticks(kem_port:os_pid(whereis(P))) || P <- lists:sort(kem_sup:port_names())].

proc_ticks({ok, OsPid}) -> proc_ticks(OsPid);
proc_ticks(OsPid) when is_integer(OsPid) ->
    {ok, Stat} = file:read_file("/proc/" ++ integer_to_list(OsPid) ++ "/stat"),
    [_, AfterComm] = binary:split(Stat, <<") ">>),
    Fields = binary:split(AfterComm, <<" ">>, [global]),
    binary_to_integer(lists:nth(12, Fields)) + binary_to_integer(lists:nth(13, Fields));
proc_ticks(_) -> 0.

ticks() -> 100.

%% Fun's result and the schedulers' busy microseconds while it ran.
busy(Fun) ->
    T0 = lists:sort(erlang:statistics(scheduler_wall_time)),
    R = Fun(),
    T1 = lists:sort(erlang:statistics(scheduler_wall_time)),
    Busy = lists:sum([A1 - A0 || {{I, A0, _}, {I, A1, _}} <- lists:zip(T0, T1), I =< erlang:system_info(schedulers)]),
    {R, Busy / (erlang:convert_time_unit(1, second, native) / 1.0e6)}.

%% Each port's share of the row's calls (from its calls counter), in %.
share(Before, After) ->
    Calls = [{P, calls(maps:get(P, After, #{})) - calls(maps:get(P, Before, #{}))} || P <- lists:sort(maps:keys(After))],
    Total = max(1, lists:sum([N || {_, N} <- Calls])),
    [round(100 * N / Total) || {_, N} <- Calls].

calls(#{calls := N}) -> N;
calls(#{<<"calls">> := N}) -> N;
calls(_) -> 0.
