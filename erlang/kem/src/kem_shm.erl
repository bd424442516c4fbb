%%% @doc The shared-memory side channel for large payloads.
%%%
%%% A port pipe moves ~0.1-0.2 GB/s each way here; /dev/shm files move
%%% 2-3 GB/s (docs/benchmarks.md). For an input of at least `shm_threshold'
%%% bytes, the input goes to a file in this node's directory (kem_shm_dir),
%%% the port reads it there and writes the result to a second file, which
%%% is read back here.
%%%
%%% The files belong to a transfer process, not to the caller: the caller
%%% only waits for its answer. A caller killed mid-call (an HTTP handler
%%% whose client hung up) cannot skip the clean-up, because the transfer
%%% runs on until the port has answered, then deletes both files.
%%% Files are made exclusively (O_EXCL: never an existing file, never
%%% through a link) and 0600, inside the 0700 directory.
%%%
%%% When a file cannot be written (/dev/shm full) or there is no directory
%%% (read-only, squatted), the payload takes the port pipe instead: a call
%%% is never failed for the side channel's sake.
%%%
%%% From `shm_slot_threshold' (16 MiB) up, a transfer takes a slot of kept
%%% part files instead (kem_shm_slots): the payload is written and read a
%%% part per process, into tmpfs pages that exist from the last call.
-module(kem_shm).
-export([call/4]).

-define(RETRY_DELETE_MS, 3000).

%% @doc Call Port with Method/Args, through files when the input is large.
-spec call(atom() | pid(), atom(), tuple(), timeout()) -> {ok, term()} | {error, kem_port:reason()}.
call(Port, Method, Args, Timeout) ->
    case {as_execute(Method, Args), kem_shm_dir:path()} of
        {{ok, Kernel, Input, Opts}, Dir} when is_list(Dir) ->
            case large(Input) of
                true -> via_transfer(Dir, Port, {Method, Args, Kernel, Input, Opts}, Timeout);
                false -> kem_port:call(Port, Method, Args, Timeout)
            end;
        _ ->
            kem_port:call(Port, Method, Args, Timeout)
    end.

large(Input) ->
    Threshold = application:get_env(kem, shm_threshold, 1 bsl 20),
    is_integer(Threshold) andalso byte_size(Input) >= Threshold.

%% The three kernel methods as one `execute' with options.
as_execute(execute_kernel, {K, I, Hint}) when is_binary(I), is_integer(Hint) ->
    {ok, K, I, #{output_size_hint => Hint}};
as_execute(execute_kernel, {K, I, Hint, usage}) when is_binary(I), is_integer(Hint) ->  % its gas asked (kem_usage)
    {ok, K, I, #{output_size_hint => Hint, usage => true}};
as_execute(execute_kernel_with_params, {K, I, P}) when is_binary(I) ->
    {ok, K, I, #{params => P}};
as_execute(execute, {K, I, Opts}) when is_binary(I), is_map(Opts) ->
    {ok, K, I, Opts};
as_execute(_, _) ->
    direct.

%% Run the transfer in its own process (monitored, not linked) and wait.
via_transfer(Dir, Port, Request, Timeout) ->
    Caller = self(),
    Tag = make_ref(),
    {Pid, MRef} = spawn_monitor(fun() -> Caller ! {Tag, transfer(Caller, Dir, Port, Request, Timeout)} end),
    receive
        {Tag, Result} ->
            erlang:demonitor(MRef, [flush]),
            Result;
        {'DOWN', MRef, process, Pid, _Why} ->
            {error, {shm_error, <<"the transfer process failed">>}}
    end.

transfer(Caller, Dir, Port, Request = {_, _, _, Input, _}, Timeout) ->
    Threshold = application:get_env(kem, shm_slot_threshold, 16 bsl 20),
    Slot = case is_integer(Threshold) andalso byte_size(Input) >= Threshold of
        true -> kem_shm_slots:take(Dir);
        false -> none
    end,
    case Slot of
        {ok, Taken} -> via_slot(Caller, Taken, Port, Request, Timeout);
        none -> via_files(Dir, Port, Request, Timeout)
    end.

%% One-off files: made for this call, deleted after it.
via_files(Dir, Port, {Method, Args, Kernel, Input, Opts}, Timeout) ->
    Base = filename:join(Dir, integer_to_list(erlang:unique_integer([positive]))),
    {In, Out} = {Base ++ ".in", Base ++ ".out"},
    Started = erlang:monotonic_time(millisecond),
    Pipe = fun() -> kem_port:call(Port, Method, Args, left(Timeout, Started)) end,
    try kem_shm_dir:write_private(In, Input) of
        ok ->
            ShmArgs = {Kernel, {shm, list_to_binary(In)}, Opts#{output_shm => list_to_binary(Out)}},
            Result = kem_port:call(Port, execute, ShmArgs, Timeout),
            _ = file:delete(In),
            retry_delete_if_port_lost(Result, Out),
            answer(Result, Out, Pipe);
        {error, Reason} ->
            _ = file:delete(In),
            logger:notice("kem_shm: cannot write an input file (~0p); using the port pipe", [Reason]),
            Pipe()
    after
        _ = file:delete(In),
        _ = file:delete(Out)
    end.

%% Kept part files (kem_shm_slots); the slot is given back, kept or
%% emptied, however the call went.
via_slot(Caller, Slot, Port, {Method, Args, Kernel, Input, Opts}, Timeout) ->
    Started = erlang:monotonic_time(millisecond),
    Pipe = fun() -> kem_port:call(Port, Method, Args, left(Timeout, Started)) end,
    try kem_shm_slots:write_input(Slot, Input) of
        ok ->
            Names = fun(Kind) -> [list_to_binary(P) || P <- kem_shm_slots:paths(Slot, Kind)] end,
            ShmArgs = {Kernel, {shm, Names(in)}, Opts#{output_shm => Names(out)}},
            Result = kem_port:call(Port, execute, ShmArgs, Timeout),
            Answer = slot_answer(Result, Slot, Pipe),
            settle(Slot, Result, Answer, Caller),
            Answer;
        {error, Reason} ->
            ok = kem_shm_slots:discard(Slot),
            logger:notice("kem_shm: cannot write an input part (~0p); using the port pipe", [Reason]),
            Pipe()
    catch Class:Why:Stack ->
        ok = kem_shm_slots:discard(Slot),
        erlang:raise(Class, Why, Stack)
    end.

%% A call that asked for its usage has it beside the file's name (kem_usage).
slot_answer({ok, {{shm, _, _} = Shm, Usage}}, Slot, Pipe) when is_map(Usage) ->
    kem_usage:beside(slot_answer({ok, Shm}, Slot, Pipe), Usage);
slot_answer({ok, {shm, _Paths, Size}}, Slot, _Pipe) when is_integer(Size), Size >= 0 ->
    kem_shm_slots:read_result(Slot, Size);
slot_answer({ok, {shm, _Paths, _Bad}}, _Slot, _Pipe) ->
    {error, {shm_error, <<"the port named no result size">>}};
slot_answer({error, {shm_error, _}}, _Slot, Pipe) ->
    Pipe();
slot_answer(Other, _Slot, _Pipe) ->
    Other.

%% After a lost port the slot's files go at once, with those of every free
%% slot (a cache for a port that is gone); as the lost port may write into
%% the result parts for up to the owner's kill -9 backstop, the slot stays
%% taken till it cannot, and is emptied again then. A killed caller's files
%% go at once; so do those of a part the port could not write (tmpfs full:
%% free what it holds) or the node could not read.
settle(Slot = #{dir := Dir}, {error, {Reason, _}}, _Answer, _Caller)
        when Reason =:= timeout; Reason =:= port_exited; Reason =:= port_restarted ->
    ok = kem_shm_slots:delete_files(Slot),
    _ = kem_shm_slots:empty_free(Dir),
    _ = timer:apply_after(?RETRY_DELETE_MS, kem_shm_slots, discard, [Slot]),
    ok;
settle(Slot, {error, {shm_error, _}}, _Answer, _Caller) ->
    kem_shm_slots:discard(Slot);
settle(Slot, _Result, {error, {shm_error, _}}, _Caller) ->
    kem_shm_slots:discard(Slot);
settle(Slot, _Result, _Answer, Caller) ->
    case is_process_alive(Caller) of
        true -> kem_shm_slots:release(Slot);
        false -> kem_shm_slots:discard(Slot)
    end.

answer({ok, {{shm, _, _} = Shm, Usage}}, Out, Pipe) when is_map(Usage) ->
    kem_usage:beside(answer({ok, Shm}, Out, Pipe), Usage);
answer({ok, {shm, _Path, Size}}, Out, _Pipe) ->
    read_result(Out, Size);
answer({error, {shm_error, _}}, _Out, Pipe) ->
    %% The port could not write the result file (tmpfs full): the pipe.
    Pipe();
answer(Other, _Out, _Pipe) ->
    Other.

%% A port killed on a timeout may still be writing for up to the owner's
%% kill -9 backstop (2 s): delete its file again after that.
retry_delete_if_port_lost({error, {Reason, _}}, Out)
        when Reason =:= timeout; Reason =:= port_exited; Reason =:= port_restarted ->
    _ = timer:apply_after(?RETRY_DELETE_MS, file, delete, [Out]),
    ok;
retry_delete_if_port_lost(_, _) ->
    ok.

left(infinity, _Started) -> infinity;
left(Timeout, Started) -> max(1, Timeout - (erlang:monotonic_time(millisecond) - Started)).

read_result(Out, Size) ->
    case file:read_file(Out) of
        {ok, Bin} when byte_size(Bin) =:= Size -> {ok, Bin};
        {ok, Bin} -> {error, {shm_error, size_note(Size, byte_size(Bin))}};
        {error, Reason} -> {error, {shm_error, <<"cannot read the result file: ", (atom_to_binary(Reason, utf8))/binary>>}}
    end.

size_note(Want, Got) ->
    iolist_to_binary(io_lib:format("result file has ~b bytes, the port wrote ~b", [Got, Want])).
