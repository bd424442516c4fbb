%%% @doc The Python process behind a port owner (kem_port): how it is
%%% opened (interpreter, arguments, environment: the port's settings, the
%%% node's shared-memory dir, a runtime dir for Mesa) and how it is made to
%%% go (stdin closed, then SIGKILL from a reaper). No state: the owner and
%%% kem_spare, which opens warm spares the same way, both call it.
-module(kem_port_process).

-export([open/4, open_port_process/2, close_port/3, os_pid_of/1, python_executable/0]).

-type command() :: {module, string()} | {script, string()}.
-export_type([command/0]).

%% @doc Open the Python process running Command (`-m Module' or a script)
%% with Env on top of the port's environment (port_env/1).
-spec open(string(), command(), string() | undefined, [{string(), string()}]) ->
    {ok, port()} | {error, term()}.
open(Python, Command, ShmDir, Env) ->
    Args = case Command of {module, Module} -> ["-m", Module]; {script, Path} -> [Path] end,
    Base = [{K, V} || {K, V} <- port_env(ShmDir), not lists:keymember(K, 1, Env)],
    %% `eof' and no `exit_status': the owner hears of a death when the pipe
    %% closes. With `exit_status' erts holds the end of file back until the
    %% process has been reaped, after the GPU driver's teardown
    %% (kem_port's port_output_closed/1). erl_child_setup reaps every child
    %% either way.
    Opts = [{packet, 4}, binary, eof, use_stdio, hide,
            {args, Args}, {env, Base ++ Env}],
    try
        {ok, open_port({spawn_executable, Python}, Opts)}
    catch
        error:Reason -> {error, {python_not_startable, Python, Reason}}
    end.

%% @doc Open a Python `kem_port' process with the node's shared-memory
%% directory (for kem_spare): the port and its OS pid.
-spec open_port_process(string() | undefined, [{string(), string()}]) ->
    {ok, port(), integer() | undefined} | {error, term()}.
open_port_process(ShmDir, Env) ->
    case open(python_executable(), {module, "kem_port"}, ShmDir, Env) of
        {ok, Port} -> {ok, Port, os_pid_of(Port)};
        Error -> Error
    end.

%% @doc Close a port and make sure its process goes: closing stdin makes
%% Python exit at once (its reader thread sees EOF even if the GPU thread is
%% stuck in a kernel); a reaper process sends SIGKILL, at once (`now') or
%% after 2 s (`later', for a process that does not exit on EOF). Never blocks.
-spec close_port(port(), integer() | undefined, now | later) -> ok.
close_port(Port, OsPid, When) ->
    catch port_close(Port),
    reap(OsPid, When),
    ok.

%% @doc The OS pid of the process behind Port (`undefined' once closed).
-spec os_pid_of(port()) -> integer() | undefined.
os_pid_of(Port) ->
    case erlang:port_info(Port, os_pid) of
        {os_pid, P} -> P;
        _ -> undefined
    end.

%% @doc The interpreter that runs the port (see kem_python).
-spec python_executable() -> string().
python_executable() ->
    kem_python:executable().

%%% internals

reap(undefined, _When) -> ok;
reap(OsPid, When) ->
    spawn(fun() ->
        When =:= later andalso timer:sleep(2000),
        %% Only if that pid is still a kem port: after 2 s it may belong to
        %% another process.
        P = integer_to_list(OsPid),
        os:cmd("grep -qs kem_port /proc/" ++ P ++ "/cmdline && kill -9 " ++ P ++ " 2>/dev/null")
    end).

%% The port's settings (kem_settings), this node's shared-memory dir (handed
%% in by kem_sup), and a runtime dir for Mesa where the node has none.
port_env(ShmDir) ->
    Shm = [{"KEM_SHM_DIR", ShmDir} || is_list(ShmDir)],
    runtime_dir() ++ Shm ++ kem_settings:port_env().

%% Mesa's Vulkan loader prints "XDG_RUNTIME_DIR is invalid or not set" on
%% stderr, which is the node's console, at every device open when a service
%% runs without a login session. A private 0700 dir keeps it quiet.
runtime_dir() ->
    case os:getenv("XDG_RUNTIME_DIR") of
        false ->
            Dir = filename:join(filename:basedir(user_cache, "kem"), "runtime"),
            case filelib:ensure_path(Dir) =:= ok andalso file:change_mode(Dir, 8#700) =:= ok of
                true -> [{"XDG_RUNTIME_DIR", Dir}];
                false -> []
            end;
        _ ->
            []
    end.
