%%% @doc Gas from Erlang on whatever adapter the node has (issue 27):
%%% runaway kernels of several shapes, each answered `gas_exhausted' by
%%% budget (how long the caller waited, how long the next call took, the
%%% port's OS pid before and after), and the gas of integer kernels on
%%% fixed inputs (debug mode reports it), to compare two adapters' tables.
%%% On lavapipe every loop stops by itself at 65,535 iterations, so only
%%% the smaller limit shows a budget there. `scripts/bench gas [out.json]'.
-module(kem_gas_bench).
-export([run/1]).

-define(HEAD, "@group(0) @binding(0) var<storage, read> inp: array<u32>;\n"
              "@group(0) @binding(1) var<storage, read_write> out: array<u32>;\n").

%% Runaways: each spins until a word no one writes changes.
runaways() ->
    [{"spin", "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
              "  var x = 0u; while (inp[0] != 12345u) { x += 1u; } out[g.x] = x; }\n"},
     {"nested", "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
                "  var x = 0u; loop { for (var k = 0u; k < 1000u + inp[0]; k++) { x += k; } if (inp[0] == 12345u) { break; } } out[g.x] = x; }\n"},
     {"barrier", "var<workgroup> s: array<u32, 64>;\n"
                 "@compute @workgroup_size(64) fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(global_invocation_id) g: vec3<u32>) {\n"
                 "  var x = 0u; loop { s[l.x] = x; workgroupBarrier(); x += s[(l.x + 1u) % 64u]; workgroupBarrier(); if (inp[0] == 12345u) { break; } } out[g.x] = x; }\n"},
     {"helper", "fn spin(a: u32) -> u32 { var x = a; while (inp[0] != 12345u) { x = x * 3u + 1u; } return x; }\n"
                "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) { out[g.x] = spin(g.x); }\n"},
     {"atomic", {raw, "@group(0) @binding(0) var<storage, read> inp: array<u32>;\n"
                "@group(0) @binding(1) var<storage, read_write> out: array<atomic<u32>>;\n"
                "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
                "  loop { if (atomicLoad(&out[0]) == 7u) { break; } } atomicStore(&out[g.x], 1u); }\n"}}].

%% Integer kernels whose loops depend on the data.
counters() ->
    [{"tri", "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
             "  if (g.x >= arrayLength(&out)) { return; }\n"
             "  var acc = 0u; for (var k = 0u; k < inp[g.x] % 97u; k++) { for (var j = 0u; j < k; j++) { acc += j; } } out[g.x] = acc; }\n"},
     {"collatz", "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
                 "  if (g.x >= arrayLength(&out)) { return; }\n"
                 "  var n = inp[g.x] % 100000u + 1u; var steps = 0u;\n"
                 "  while (n != 1u) { if (n % 2u == 0u) { n = n / 2u; } else { n = 3u * n + 1u; } steps++; } out[g.x] = steps; }\n"},
     {"reduce", "var<workgroup> s: array<u32, 64>;\n"
                "@compute @workgroup_size(64) fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {\n"
                "  s[l.x] = inp[w.x * 64u + l.x] % 1000u; workgroupBarrier();\n"
                "  for (var k = 32u; k > 0u; k = k / 2u) { if (l.x < k) { s[l.x] += s[l.x + k]; } workgroupBarrier(); }\n"
                "  if (l.x == 0u) { out[w.x] = s[0]; } }\n"},
     {"plain", "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
               "  if (g.x >= arrayLength(&out)) { return; } out[g.x] = inp[g.x] * 2u; }\n"}].

%% @doc Runaway rows and the gas table; prints both and writes OutFile.
-spec run(string()) -> ok.
run(OutFile) ->
    logger:set_primary_config(level, notice),
    Dir = filename:join("/tmp", "kem_gas_bench_" ++ os:getpid()),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    [ok = file:write_file(filename:join(Dir, N ++ ".wgsl"), source(S)) || {N, S} <- runaways() ++ counters()],
    ok = application:load(kem),
    ok = application:set_env(kem, kernel_dir, Dir),
    {ok, _} = application:ensure_all_started(kem),
    kem_bench:settle(),
    {ok, Info} = kem:adapter_info(),
    Adapter = maps:get(<<"name">>, element(2, kem_json:decode(Info))),
    [Port | _] = kem_sup:port_names(),
    Small = fun() -> {ok, _} = kem:execute(<<"plain">>, <<1:32/little>>, #{output_size => 4}) end,
    [Small() || _ <- lists:seq(1, 20)],
    Rows = [runaway_row(N, Limit, Port, Small) || Limit <- limits(), {N, _} <- runaways()],
    Gas = [gas_row(N, Words) || {N, _} <- counters(), Words <- [64, 4096, 262144]],
    ok = file:write_file(OutFile, kem_json:encode(#{adapter => Adapter, runaways => Rows, gas => Gas})),
    io:format("adapter: ~s~n", [Adapter]),
    [io:format("runaway ~-8s limit ~-10w -> ~-14w answered in ~9.2f ms, next call ~7.2f ms, same OS pid: ~w~n",
               [N, L, R, A, Nx, Same])
     || #{shape := N, limit := L, result := R, answer_ms := A, next_ms := Nx, same_pid := Same} <- Rows],
    [io:format("gas ~-8s ~7b words: ~b~n", [N, W, G]) || #{kernel := N, words := W, gas := G} <- Gas],
    file:del_dir_r(Dir),
    ok.

source({raw, S}) -> S;
source(S) -> [?HEAD, S].

runaway_row(Name, Limit, Port, Small) ->
    Opts = case Limit of default -> #{output_size => 256}; _ -> #{output_size => 256, gas_limit => Limit} end,
    Pid0 = kem_port:os_pid(Port),
    T0 = erlang:monotonic_time(microsecond),
    R = kem:execute(list_to_binary(Name), <<0:32>>, Opts#{timeout => 60000}),
    T1 = erlang:monotonic_time(microsecond),
    io:format("  ~s ~w: ~P~n", [Name, Limit, R, 12]),
    catch Small(),
    T2 = erlang:monotonic_time(microsecond),
    #{shape => list_to_binary(Name), limit => Limit, result => tag(R), answer_ms => (T1 - T0) / 1000,
      next_ms => (T2 - T1) / 1000, same_pid => (catch kem_port:os_pid(Port)) =:= Pid0}.

tag({error, {Reason, _}}) -> Reason;
tag({ok, _}) -> ok;
tag({ok, _, _}) -> ok.

%% The gas of one call on fixed inputs (the same on every machine: a fixed seed).
gas_row(Name, Words) ->
    S0 = rand:seed_s(exsss, {17, 29, Words}),
    {Input, _} = lists:foldl(fun(_, {Acc, S}) -> {V, S1} = rand:uniform_s(1 bsl 32, S), {<<Acc/binary, (V - 1):32/little>>, S1} end,
                             {<<>>, S0}, lists:seq(1, Words)),
    %% The reduction's output is smaller than its work: its grid is explicit.
    Opts = case Name of "reduce" -> #{output_size => Words div 16, grid => {Words, 1, 1}}; _ -> #{output_size => 4 * Words} end,
    {ok, _Out, #{debug := #{gas := Gas}}} =
        kem:execute(list_to_binary(Name), Input, Opts#{debug => true, gas_limit => 1 bsl 40, timeout => 60000}),
    #{kernel => list_to_binary(Name), words => Words, gas => Gas}.

%% 1,000 and 65,000 loop turns an invocation (64 invocations a call); the
%% node's default (`gas_limit' app env) with KEM_GAS_BENCH_DEFAULT=1.
limits() ->
    [64 * 1000, 64 * 65000] ++ case os:getenv("KEM_GAS_BENCH_DEFAULT") of "1" -> [default]; _ -> [] end.
