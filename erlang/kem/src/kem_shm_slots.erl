%%% @doc Kept part files for bulk payloads (docs/executor.md, "Bulk
%%% payloads in parts"). From `shm_slot_threshold' (16 MiB) up, kem_shm
%%% moves a payload through a slot: 8 input and 8 result files in the
%%% node's shared-memory directory, each holding one part of the payload,
%%% kept from call to call.
%%%
%%% Why (scripts/bench_bulk_floor on the H100 host, 64 MB): one Erlang
%%% process writes a fresh tmpfs file at 2.0 GB/s (34 ms) and a kept one at
%%% 5.2 GB/s (13 ms): the difference is tmpfs allocating and zeroing pages.
%%% Eight processes writing eight kept parts take 3.3 ms (eight fresh
%%% parts: 11 ms); one file cannot be written faster from several processes,
%%% as tmpfs serializes writes to one inode. Reading the eight result parts
%%% in parallel and joining them takes 10.8 ms against 14.6 ms for one file.
%%%
%%% A slot is taken by one transfer at a time (an ETS row made with
%%% insert_new is its lock; kem_shm_dir owns the table). Its files stay when
%%% the call went well and its caller is alive; they are deleted when the
%%% caller was killed meanwhile, when a part cannot be written or read, and
%%% after the port was lost (only once the lost port can no longer write:
%%% the slot stays taken till then). kem_shm_dir deletes the files of slots
%%% idle for `shm_slot_idle_ms'; a node that died leaves them in a
%%% directory the next start sweeps.
-module(kem_shm_slots).
-export([new_table/0, take/1, release/1, discard/1, delete_files/1, trim/1, empty_free/1]).
-export([write_input/2, read_result/2, paths/2, split/2]).

-include_lib("kernel/include/file.hrl").

-define(TAB, kem_shm_slots).
-define(PARTS, 8).

-type slot() :: #{id := pos_integer(), dir := kem_shm_dir:dir()}.
-export_type([slot/0]).

%% @doc The table of taken slots and their last use; its owner (the
%% directory's owner, kem_shm_dir) outlives every transfer.
-spec new_table() -> ok.
new_table() ->
    ?TAB = ets:new(?TAB, [named_table, public, set]),
    ok.

%% @doc A free slot in Dir, now taken by the caller, or `none' (all taken:
%% the transfer makes one-off files as below the threshold).
-spec take(kem_shm_dir:dir()) -> {ok, slot()} | none.
take(Dir) ->
    take(Dir, 1, application:get_env(kem, shm_slots, 2)).

take(_Dir, Id, Slots) when Id > Slots ->
    none;
take(Dir, Id, Slots) ->
    case catch ets:insert_new(?TAB, {{taken, Id}, self()}) of
        true -> {ok, #{id => Id, dir => Dir}};
        false -> take(Dir, Id + 1, Slots);
        {'EXIT', _} -> none  % no table: the directory's owner is stopping
    end.

%% @doc Give the slot back with its files, for the next transfer.
-spec release(slot()) -> ok.
release(#{id := Id}) ->
    _ = catch ets:insert(?TAB, {{used, Id}, erlang:monotonic_time(millisecond)}),
    _ = catch ets:delete(?TAB, {taken, Id}),
    ok.

%% @doc Delete the slot's files, then give it back.
-spec discard(slot()) -> ok.
discard(Slot = #{id := Id}) ->
    ok = delete_files(Slot),
    _ = catch ets:delete(?TAB, {used, Id}),
    _ = catch ets:delete(?TAB, {taken, Id}),
    ok.

%% @doc Delete the slot's files and keep it taken (a lost port may still
%% be writing: discard/1 later gives it back).
-spec delete_files(slot()) -> ok.
delete_files(Slot) ->
    [_ = file:delete(Path) || Kind <- [in, out], Path <- paths(Slot, Kind)],
    ok.

%% @doc Delete the files of free slots unused for `shm_slot_idle_ms'
%% (memory held in tmpfs for nothing); returns how many were emptied.
-spec trim(kem_shm_dir:dir()) -> non_neg_integer().
trim(Dir) ->
    empty_free(Dir, application:get_env(kem, shm_slot_idle_ms, 10000)).

%% @doc Delete the files of every free slot: after a lost port the kept
%% files are a cache for nothing, and a restart begins cold.
-spec empty_free(kem_shm_dir:dir()) -> non_neg_integer().
empty_free(Dir) ->
    empty_free(Dir, 0).

empty_free(Dir, IdleMs) ->
    Now = erlang:monotonic_time(millisecond),
    Rows = try ets:tab2list(?TAB) catch error:badarg -> [] end,  % no table: stopping
    Idle = [Id || {{used, Id}, At} <- Rows, Now - At >= IdleMs],
    length([ok || Id <- Idle, {ok, Slot} <- [take_id(Dir, Id)], discard(Slot) =:= ok]).

take_id(Dir, Id) ->
    case catch ets:insert_new(?TAB, {{taken, Id}, self()}) of
        true -> {ok, #{id => Id, dir => Dir}};
        _ -> none
    end.

%% @doc The slot's part files of one direction, in payload order.
-spec paths(slot(), in | out) -> [file:filename()].
paths(#{id := Id, dir := Dir}, Kind) ->
    [filename:join(Dir, lists:concat(["slot", Id, ".", Kind, ".", K])) || K <- lists:seq(0, ?PARTS - 1)].

%% @doc Size bytes cut into N ranges {Start, End} of one length but the
%% last (some may be empty): the port splits results by the same rule
%% (kem_port/bulk_io.py split).
-spec split(non_neg_integer(), pos_integer()) -> [{non_neg_integer(), non_neg_integer()}].
split(Size, N) ->
    Step = (Size + N - 1) div N,
    [{min(Size, K * Step), min(Size, (K + 1) * Step)} || K <- lists:seq(0, N - 1)].

%% @doc Input into the slot's input parts, a process a part.
-spec write_input(slot(), binary()) -> ok | {error, term()}.
write_input(Slot, Input) ->
    Jobs = [fun() -> write_part(Path, binary:part(Input, Start, End - Start)) end
            || {Path, {Start, End}} <- lists:zip(paths(Slot, in), split(byte_size(Input), ?PARTS))],
    case [E || E <- in_parallel(Jobs), E =/= ok] of
        [] -> ok;
        [Error | _] -> Error
    end.

%% A kept part is written over in place (its pages exist), then cut to
%% size; a missing one is made as every payload file is (exclusive, 0600).
%% Anything else at the name (a link, a FIFO, a file that is not private)
%% is refused, never written through.
write_part(Path, Part) ->
    case file:read_link_info(Path, [raw]) of
        {ok, #file_info{type = regular, links = 1, mode = Mode, size = Old}} when Mode band 8#077 =:= 0 ->
            overwrite(Path, Part, Old);
        {ok, _} ->
            {error, {not_private, Path}};
        {error, enoent} ->
            kem_shm_dir:write_private(Path, Part);
        {error, Reason} ->
            {error, Reason}
    end.

overwrite(Path, Part, Old) ->
    case file:open(Path, [read, write, raw, binary]) of
        {ok, Fd} ->
            try
                ok = file:pwrite(Fd, 0, Part),
                Old > byte_size(Part) andalso begin
                    {ok, _} = file:position(Fd, byte_size(Part)),
                    ok = file:truncate(Fd)
                end,
                ok
            catch error:{badmatch, Error} -> Error
            after file:close(Fd)
            end;
        Error ->
            Error
    end.

%% @doc The result the port split over the slot's result parts, joined:
%% {shm_error, _} when a part is missing or not of its size.
-spec read_result(slot(), non_neg_integer()) -> {ok, binary()} | {error, {shm_error, binary()}}.
read_result(Slot, Size) ->
    Jobs = [fun() -> read_part(Path, End - Start) end
            || {Path, {Start, End}} <- lists:zip(paths(Slot, out), split(Size, ?PARTS))],
    Parts = in_parallel(Jobs),
    case [E || {error, _} = E <- Parts] of
        [] -> {ok, iolist_to_binary([Bin || {ok, Bin} <- Parts])};
        [Error | _] -> Error
    end.

read_part(_Path, 0) ->
    {ok, <<>>};
read_part(Path, Size) ->
    %% The size is the port's word: the file must have it before a binary
    %% of that size is made.
    case file:read_link_info(Path, [raw]) of
        {ok, #file_info{type = regular, size = Size}} -> pread_part(Path, Size);
        {ok, _} -> {error, {shm_error, <<"a result part is not of the size the port wrote">>}};
        {error, Reason} -> part_error(Reason)
    end.

pread_part(Path, Size) ->
    case file:open(Path, [read, raw, binary]) of
        {ok, Fd} ->
            try file:pread(Fd, 0, Size) of
                {ok, Bin} when byte_size(Bin) =:= Size -> {ok, Bin};
                {ok, _} -> {error, {shm_error, <<"a result part is shorter than the port wrote">>}};
                eof -> {error, {shm_error, <<"a result part is empty">>}};
                {error, Reason} -> part_error(Reason)
            after
                file:close(Fd)
            end;
        {error, Reason} ->
            part_error(Reason)
    end.

part_error(Reason) ->
    {error, {shm_error, <<"cannot read a result part: ", (atom_to_binary(Reason, utf8))/binary>>}}.

%% Each job in its own process (raw file operations run on the dirty IO
%% schedulers, so the copies run side by side); results in job order. A
%% job that crashed is an error, not a crash of the transfer.
in_parallel(Jobs) ->
    Tag = make_ref(),
    Parent = self(),
    Workers = [spawn_monitor(fun() -> Parent ! {Tag, self(), Job()} end) || Job <- Jobs],
    [receive
         {Tag, Pid, Result} -> erlang:demonitor(MRef, [flush]), Result;
         {'DOWN', MRef, process, Pid, Why} -> {error, {part_failed, Why}}
     end || {Pid, MRef} <- Workers].
