%%% @doc This node's shared-memory directory: made safely, owned, swept.
%%%
%%% The side channel (kem_shm) moves large payloads through files in one
%%% directory per node. Anyone on the host may write to /dev/shm, so the
%%% directory is never taken on trust:
%%% - its name is `kem-' and 128 random bits, not the OS pid, so nobody can
%%%   make it first; it is made with mkdir, which fails on anything already
%%%   at that name (a symlink included): such a name is refused, never
%%%   adopted. It is set to 0700 and checked (a real directory, our uid, no
%%%   access for others) before it is used;
%%% - it holds an `owner' file (pid and kernel start time of this node's OS
%%%   process), so a later start can prove that a directory left behind is
%%%   ours and that its node is gone: only such directories are swept;
%%% - when it cannot be made (/dev/shm read-only, full, missing, squatted)
%%%   the app still starts and large payloads take the port pipe.
%%% kem_sup calls `create/0' before it starts the ports, hands the directory
%%% to each port owner and to this module's server, which owns it: the
%%% server publishes it for kem_shm and removes it when the app stops.
-module(kem_shm_dir).
-behaviour(gen_server).

-include_lib("kernel/include/file.hrl").

-export([create/0, create/1, make/3, sweep/2, write_private/2, own_uid/0, own_start/0]).
-export([start_link/1, path/0]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-define(PREFIX, "kem-").
-define(MARKER, "owner").
-define(KEY, {kem, shm_dir}).
%% A collision of 128 random bits means someone guessed the name ahead of
%% us: a few tries, then the pipe.
-define(TRIES, 3).

-type dir() :: string().
-export_type([dir/0]).

%%% making the directory

%% @doc Sweep dead nodes' directories under the root (app env `shm_root',
%% default /dev/shm), then make this node's. Never raises.
-spec create() -> {ok, dir()} | {error, term()}.
create() ->
    create(application:get_env(kem, shm_root, "/dev/shm")).

-spec create(file:filename()) -> {ok, dir()} | {error, term()}.
create(Root) ->
    case {own_uid(), own_start()} of
        {{ok, Uid}, {ok, Start}} ->
            _ = sweep(Root, Uid),
            make_fresh(Root, Uid, Start, ?TRIES);
        {{error, _} = Error, _} -> Error;
        {_, Error} -> Error
    end.

make_fresh(_Root, _Uid, _Start, 0) ->
    {error, squatted};
make_fresh(Root, Uid, Start, Tries) ->
    Name = ?PREFIX ++ string:lowercase(binary_to_list(binary:encode_hex(crypto:strong_rand_bytes(16)))),
    case make(filename:join(Root, Name), Uid, Start) of
        {error, {exists, _}} -> make_fresh(Root, Uid, Start, Tries - 1);
        Other -> Other
    end.

%% @doc Make Dir exclusively, private to Uid, with its owner file; refuse
%% whatever is already at that name. Exported for the tests.
-spec make(dir(), non_neg_integer(), string()) -> {ok, dir()} | {error, term()}.
make(Dir, Uid, Start) ->
    case file:make_dir(Dir) of
        ok ->
            case secure(Dir, Uid, Start) of
                ok -> {ok, Dir};
                Error -> _ = file:del_dir_r(Dir), Error
            end;
        {error, eexist} -> {error, {exists, Dir}};
        {error, Reason} -> {error, Reason}
    end.

secure(Dir, Uid, Start) ->
    first_error([fun() -> file:change_mode(Dir, 8#700) end,
                 fun() -> check_private(Dir, Uid, directory) end,
                 fun() -> write_private(filename:join(Dir, ?MARKER), [os:getpid(), " ", Start, "\n"]) end]).

first_error([]) -> ok;
first_error([Step | Rest]) ->
    case Step() of
        ok -> first_error(Rest);
        Error -> Error
    end.

%% A path is ours when lstat (no link followed) says it is of Type, belongs
%% to Uid, and no one else may read, write or enter it.
check_private(Path, Uid, Type) ->
    case file:read_link_info(Path) of
        {ok, #file_info{type = Type, uid = Uid, mode = Mode}} when Mode band 8#077 =:= 0 -> ok;
        {ok, _} -> {error, {not_private, Path}};
        {error, Reason} -> {error, Reason}
    end.

%% @doc Write Data to a new file at Path: created exclusively (O_EXCL:
%% never an existing file, never through a link), 0600 before any byte is
%% written. kem_shm writes its input files with it.
-spec write_private(file:filename(), iodata()) -> ok | {error, term()}.
write_private(Path, Data) ->
    case file:open(Path, [write, exclusive, raw, binary]) of
        {ok, Fd} ->
            Written = first_error([fun() -> file:change_mode(Path, 8#600) end,
                                   fun() -> file:write(Fd, Data) end]),
            Closed = file:close(Fd),
            case Written of
                ok -> Closed;
                _ -> Written
            end;
        Error ->
            Error
    end.

%%% sweeping

%% @doc Remove the directories under Root that provably belong to a node of
%% Uid that is gone; returns how many. Anything else is left alone: another
%% user's, one without a readable owner file, a link, one of a live node.
-spec sweep(file:filename(), non_neg_integer()) -> non_neg_integer().
sweep(Root, Uid) ->
    case file:list_dir(Root) of
        {ok, Names} ->
            Dead = [Dir || Name <- Names, lists:prefix(?PREFIX, Name),
                           Dir <- [filename:join(Root, Name)], of_dead_node(Dir, Uid)],
            length([ok || Dir <- Dead, file:del_dir_r(Dir) =:= ok]);
        {error, _} ->
            0
    end.

of_dead_node(Dir, Uid) ->
    Marker = filename:join(Dir, ?MARKER),
    case check_private(Dir, Uid, directory) =:= ok andalso check_private(Marker, Uid, regular) =:= ok of
        true -> dead(file:read_file(Marker));
        false -> false
    end.

dead({ok, Text}) when byte_size(Text) < 64 ->
    case string:lexemes(binary_to_list(Text), " \n") of
        [Pid, Start] -> proc_start(Pid) =/= {ok, Start};
        _ -> false
    end;
dead(_) ->
    false.

%% @doc This node's effective uid (Linux /proc).
-spec own_uid() -> {ok, non_neg_integer()} | {error, term()}.
own_uid() ->
    case file:read_file("/proc/self/status") of
        {ok, Status} ->
            case re:run(Status, "^Uid:\\s+\\d+\\s+(\\d+)", [multiline, {capture, all_but_first, list}]) of
                {match, [Uid]} -> {ok, list_to_integer(Uid)};
                nomatch -> {error, no_uid}
            end;
        {error, Reason} ->
            {error, Reason}
    end.

%% @doc The start time of this node's OS process (clock ticks since boot):
%% with the pid, it names the process across pid reuse.
-spec own_start() -> {ok, string()} | {error, term()}.
own_start() ->
    proc_start(os:getpid()).

proc_start(Pid) ->
    case lists:all(fun(C) -> C >= $0 andalso C =< $9 end, Pid) andalso Pid =/= "" of
        true -> stat_start(file:read_file("/proc/" ++ Pid ++ "/stat"));
        false -> {error, bad_pid}
    end.

%% Field 22 of /proc/PID/stat, counted after the command name, which is in
%% parentheses and may itself hold spaces.
stat_start({ok, Stat}) ->
    [_, AfterName] = string:split(Stat, ")", trailing),
    case string:lexemes(binary_to_list(AfterName), " ") of
        Fields when length(Fields) >= 20 -> {ok, lists:nth(20, Fields)};
        _ -> {error, bad_stat}
    end;
stat_start({error, Reason}) ->
    {error, Reason}.

%%% the owner

%% @doc Own Dir (or `none'): publish it for kem_shm, remove it at stop.
-spec start_link({ok, dir()} | {error, term()}) -> {ok, pid()} | {error, term()}.
start_link(Created) ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, Created, []).

%% @doc The directory in use, or `undefined' when large payloads take the pipe.
-spec path() -> dir() | undefined.
path() ->
    persistent_term:get(?KEY, undefined).

init(Created) ->
    process_flag(trap_exit, true),
    Dir = case Created of
        {ok, D} -> D;
        {error, Reason} ->
            logger:warning("kem: no shared-memory directory (~0p); large payloads take the port pipe",
                           [Reason]),
            undefined
    end,
    persistent_term:put(?KEY, Dir),
    ok = kem_shm_slots:new_table(),
    schedule_trim(),
    {ok, Dir}.

%% Kept slot files idle for shm_slot_idle_ms are deleted (kem_shm_slots).
schedule_trim() ->
    erlang:send_after(max(100, application:get_env(kem, shm_slot_idle_ms, 10000) div 2), self(), trim_slots).

handle_call(_Request, _From, Dir) ->
    {reply, {error, {bad_args, <<"kem_shm_dir takes no calls">>}}, Dir}.

handle_cast(_Msg, Dir) ->
    {noreply, Dir}.

handle_info(trim_slots, Dir) ->
    _ = is_list(Dir) andalso kem_shm_slots:trim(Dir),
    schedule_trim(),
    {noreply, Dir};
handle_info(_Msg, Dir) ->
    {noreply, Dir}.

terminate(_Reason, Dir) ->
    _ = persistent_term:erase(?KEY),
    _ = is_list(Dir) andalso file:del_dir_r(Dir),
    ok.
