%%% @doc The shared-memory side channel for large payloads.
%%%
%%% A port pipe moves ~0.1-0.2 GB/s each way here; /dev/shm files move
%%% 2-3 GB/s (docs/benchmarks.md). For an input of at least `shm_threshold'
%%% bytes, the caller writes it to a file in this node's directory
%%% (/dev/shm/kem-<os pid>), the port reads it there and writes the result
%%% to a second file; the caller reads that and deletes both, whatever
%%% happens (`after'). A node that dies leaves its directory behind: the
%%% next start of the app removes directories of processes that are gone.
-module(kem_shm).
-export([init/0, dir/0, call/4]).

-define(ROOT, "/dev/shm").
-define(PREFIX, "kem-").

%% @doc Create this node's directory and sweep those of dead nodes.
-spec init() -> ok.
init() ->
    case filelib:is_dir(?ROOT) of
        false -> ok;
        true ->
            sweep_stale(),
            ok = filelib:ensure_dir(filename:join(dir(), "x")),
            ok
    end.

%% @doc This node's directory, passed to the ports as KEM_SHM_DIR.
-spec dir() -> string().
dir() ->
    filename:join(?ROOT, ?PREFIX ++ os:getpid()).

%% @doc Call Port with Method/Args, through files when the input is large.
-spec call(atom() | pid(), atom(), tuple(), timeout()) -> {ok, term()} | {error, kem_port:reason()}.
call(Port, Method, Args, Timeout) ->
    case as_execute(Method, Args) of
        {ok, Kernel, Input, Opts} ->
            case use_shm(Input) of
                true -> via_files(Port, Kernel, Input, Opts, Timeout);
                false -> kem_port:call(Port, Method, Args, Timeout)
            end;
        direct ->
            kem_port:call(Port, Method, Args, Timeout)
    end.

use_shm(Input) ->
    Threshold = application:get_env(kem, shm_threshold, 1 bsl 20),
    is_integer(Threshold) andalso byte_size(Input) >= Threshold andalso filelib:is_dir(dir()).

%% The three kernel methods as one `execute' with options.
as_execute(execute_kernel, {K, I, Hint}) when is_binary(I), is_integer(Hint) ->
    {ok, K, I, #{output_size_hint => Hint}};
as_execute(execute_kernel_with_params, {K, I, P}) when is_binary(I) ->
    {ok, K, I, #{params => P}};
as_execute(execute, {K, I, Opts}) when is_binary(I), is_map(Opts) ->
    {ok, K, I, Opts};
as_execute(_, _) ->
    direct.

via_files(Port, Kernel, Input, Opts, Timeout) ->
    Base = filename:join(dir(), integer_to_list(erlang:unique_integer([positive]))),
    In = Base ++ ".in",
    Out = Base ++ ".out",
    try
        ok = file:write_file(In, Input, [raw]),
        Args = {Kernel, {shm, list_to_binary(In)}, Opts#{output_shm => list_to_binary(Out)}},
        case kem_port:call(Port, execute, Args, Timeout) of
            {ok, {shm, _Path, Size}} ->
                case file:read_file(Out) of
                    {ok, Bin} when byte_size(Bin) =:= Size -> {ok, Bin};
                    {ok, Bin} -> {error, {shm_error, size_note(Size, byte_size(Bin))}};
                    {error, Reason} -> {error, {shm_error, atom_to_binary(Reason, utf8)}}
                end;
            Other ->
                Other
        end
    after
        _ = file:delete(In),
        _ = file:delete(Out)
    end.

size_note(Want, Got) ->
    iolist_to_binary(io_lib:format("result file has ~b bytes, the port wrote ~b", [Got, Want])).

sweep_stale() ->
    Dirs = filelib:wildcard(filename:join(?ROOT, ?PREFIX ++ "*")),
    [file:del_dir_r(D) || D <- Dirs, stale(D)],
    ok.

stale(Dir) ->
    ?PREFIX ++ Pid = filename:basename(Dir),
    case string:to_integer(Pid) of
        {N, []} when is_integer(N) -> not filelib:is_dir("/proc/" ++ Pid);
        _ -> false
    end.
