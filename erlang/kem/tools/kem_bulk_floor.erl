%%% @doc The host's floors for moving a bulk payload between the node and
%%% another process, without kem or a GPU: what each way of handing 64 MB
%%% across costs from Erlang (docs/benchmarks.md, "Bulk copies"). Files in a
%%% tmpfs directory (fresh files as kem_shm used to make, files kept and
%%% overwritten with pwrite/pread, chunks written by several processes) and
%%% a port pipe to `cat' at the default 64 KiB and at a 1 MiB pipe size.
%%%
%%% scripts/bench_bulk_floor [MB ...]: one JSON line per way, median of 7.
-module(kem_bulk_floor).
-export([run/1]).

-define(REPS, 7).

-spec run([pos_integer()]) -> ok.
run(SizesMB) ->
    Dir = scratch_dir(),
    try [measure(Dir, MB bsl 20) || MB <- SizesMB] after _ = file:del_dir_r(Dir) end,
    ok.

scratch_dir() ->
    Root = case filelib:is_dir("/dev/shm") of true -> "/dev/shm"; false -> "/tmp" end,
    Dir = filename:join(Root, "kem-floor-" ++ integer_to_list(erlang:unique_integer([positive]))),
    ok = file:make_dir(Dir),
    Dir.

measure(Dir, Size) ->
    Bin = crypto:strong_rand_bytes(Size),
    Path = filename:join(Dir, "payload"),
    Rows = [
        {"write fresh file (open excl + write)", fun() -> write_fresh(Path, Bin) end},
        {"read_file", fun() -> {ok, B} = file:read_file(Path), Size = byte_size(B) end},
        {"pwrite kept file (raw fd)", kept(Path, fun(Fd) -> ok = file:pwrite(Fd, 0, Bin) end)},
        {"pread kept file (raw fd)", kept(Path, fun(Fd) -> {ok, B} = file:pread(Fd, 0, Size), Size = byte_size(B) end)},
        {"pwrite 8 kept chunk files, 8 processes", fun() -> parallel_write(Dir, Bin, 8, kept) end},
        {"write 8 fresh chunk files, 8 processes", fun() -> parallel_write(Dir, Bin, 8, fresh) end},
        {"pread 8 chunk files, 8 processes (8 binaries)", fun() -> parallel_read(Dir, Size, 8) end},
        {"pread 8 chunk files, 8 processes, joined", fun() -> Size = byte_size(iolist_to_binary(parallel_read(Dir, Size, 8))) end},
        {"pipe to cat, 64 KiB pipe, there and back", pipe(Bin, 0)},
        {"pipe to cat, 1 MiB pipe, there and back", pipe(Bin, 1 bsl 20)}],
    _ = write_fresh(Path, Bin),
    [report(Size, Name, Fun) || {Name, Fun} <- Rows],
    [port_close(P) || P <- get_list(ports)],
    erase(ports),
    ok.

report(Size, Name, Fun) ->
    Fun(),
    Times = lists:sort([timed(Fun) || _ <- lists:seq(1, ?REPS)]),
    Med = lists:nth((?REPS + 1) div 2, Times),
    io:format("{\"size_mb\": ~b, \"way\": \"~s\", \"median_ms\": ~.2f, \"gb_per_s\": ~.2f}~n",
              [Size bsr 20, Name, Med / 1000, Size / (Med / 1.0e6) / 1.0e9]).

timed(Fun) ->
    T = erlang:monotonic_time(microsecond),
    Fun(),
    erlang:monotonic_time(microsecond) - T.

write_fresh(Path, Bin) ->
    _ = file:delete(Path),
    {ok, Fd} = file:open(Path, [write, exclusive, raw, binary]),
    ok = file:write(Fd, Bin),
    ok = file:close(Fd).

%% The file opened once, kept at its size: each run reuses its tmpfs pages.
kept(Path, Op) ->
    fun() ->
        {ok, Fd} = file:open(Path, [read, write, raw, binary]),
        try Op(Fd) after file:close(Fd) end
    end.

parallel_write(Dir, Bin, N, How) ->
    Chunk = -(-byte_size(Bin) div N),
    in_parallel(N, fun(I) ->
        Part = binary:part(Bin, I * Chunk, min(Chunk, byte_size(Bin) - I * Chunk)),
        Path = chunk_path(Dir, I),
        How =:= fresh andalso file:delete(Path),
        {ok, Fd} = file:open(Path, [read, write, raw, binary]),
        ok = file:pwrite(Fd, 0, Part),
        ok = file:close(Fd)
    end).

parallel_read(Dir, Size, N) ->
    Chunk = -(-Size div N),
    in_parallel(N, fun(I) ->
        {ok, Fd} = file:open(chunk_path(Dir, I), [read, raw, binary]),
        {ok, Part} = file:pread(Fd, 0, min(Chunk, Size - I * Chunk)),
        ok = file:close(Fd),
        Part
    end).

chunk_path(Dir, I) -> filename:join(Dir, "chunk" ++ integer_to_list(I)).

in_parallel(N, Fun) ->
    Parent = self(),
    Pids = [spawn_link(fun() -> Parent ! {self(), Fun(I)} end) || I <- lists:seq(0, N - 1)],
    [receive {Pid, R} -> R end || Pid <- Pids].

%% A frame to `cat' and back ({packet, 4} both ways): the pipe's own cost,
%% with the pipe grown by the child before it becomes cat.
pipe(Bin, PipeSize) ->
    Grow = "import fcntl,os\n"
           "n=" ++ integer_to_list(PipeSize) ++ "\n"
           "if n:\n [fcntl.fcntl(f,1031,n) for f in (0,1)]\n"
           "os.execvp('cat',['cat'])\n",
    Port = open_port({spawn_executable, os:find_executable("python3")},
                     [{args, ["-c", Grow]}, {packet, 4}, binary]),
    put(ports, [Port | get_list(ports)]),
    Size = byte_size(Bin),
    fun() ->
        true = port_command(Port, Bin),
        receive {Port, {data, Back}} when byte_size(Back) =:= Size -> ok end
    end.

get_list(Key) ->
    case get(Key) of undefined -> []; L -> L end.
