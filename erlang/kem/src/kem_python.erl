%%% @doc The Python half of kem: which interpreter runs the port, and how a
%%% node that took kem as a rebar3 dependency gets one.
%%%
%%% rebar3's `git_subdir' keeps only `erlang/kem' of the repository, so the
%%% Python package is not beside the beams. `install/0,1' creates a venv that
%%% kem owns (app env `venv', default under the user's data dir) and pip
%%% installs `kem_port' into it, by default from the very commit the app was
%%% checked out at (install/1 takes any source pip understands: a git URL, a
%%% path, a wheel), saying what pip does as it goes and what it installed:
%%%
%%%   erl -noshell -pa _build/default/lib/kem/ebin \
%%%       -eval 'ok = kem_python:install(), halt().'
%%%
%%% At start the app checks, once, which interpreter has `kem_port':
%%% `KEM_PYTHON' or the app env `python' when set (only that one), else the
%%% first of the checkout's `.venv' (searched upward from the beams), kem's
%%% own venv, `python3' on PATH. None: the app does not start, and the one
%%% error names every interpreter tried and the fix.
-module(kem_python).

-export([install/0, install/1, check/0, executable/0, venv_dir/0]).

-define(CHECK, "import importlib.util, sys; "
               "sys.exit(0 if importlib.util.find_spec('kem_port') else 3)").
%% The installed distribution's version, for the success line.
-define(VERSION, "import importlib.metadata as m; print(m.version('kem_port'))").

%% @doc Install kem_port into kem's venv from the app env `python_source',
%% else `KEM_PYTHON_SOURCE', else the git repository the app itself came
%% from: a rebar3 `git_subdir' dependency is a sparse checkout whose `.git'
%% holds the whole commit, Python package included, so pip installs the
%% very commit the beams were built from.
-spec install() -> ok | {error, {atom(), binary()}}.
install() ->
    case source() of
        false ->
            {error, {no_python_source,
                     <<"kem is not in a git checkout: give kem_python:install/1 a pip source "
                       "(git URL or path), or set the kem app env python_source or KEM_PYTHON_SOURCE">>}};
        Source ->
            install(Source)
    end.

%% @doc Install kem_port from Source (anything `pip install' takes) into
%% kem's venv, creating the venv first.
-spec install(string() | binary()) -> ok | {error, {atom(), binary()}}.
install(Source) when is_binary(Source) ->
    install(binary_to_list(Source));
install(Source) ->
    Dir = venv_dir(),
    Python = filename:join([Dir, "bin", "python"]),
    Base = os:getenv("KEM_SETUP_PYTHON", "python3"),
    case ensure_venv(Base, Dir, Python) of
        ok -> pip_install(Python, Source, Dir);
        Error -> Error
    end.

%% pip's own lines are relayed as they come (without `-q', progress bars
%% off): a fresh install resolves, downloads and builds wgpu, numpy and
%% erlang-py for a minute or more, which was a minute of silence.
-spec pip_install(string(), string(), string()) -> ok | {error, {atom(), binary()}}.
pip_install(Python, Source, Dir) ->
    logger:notice("kem_python: pip installing kem_port from ~ts into ~ts "
                  "(a fresh venv takes a minute or two)", [Source, Dir]),
    Started = erlang:monotonic_time(millisecond),
    Args = ["-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off",
            "--upgrade", Source],
    {ok, Cwd} = file:get_cwd(),
    case run(Python, Args, pip_failed, Cwd, fun pip_line/1) of
        ok -> installed(Python, Dir, Started);
        Error -> Error
    end.

-spec pip_line(binary()) -> ok.
pip_line(Line) ->
    logger:notice("kem_python: pip: ~ts", [Line]).

%% The success line: what was installed (kem_port's version), where, and
%% the interpreter the ports will run; an error when pip finished without
%% giving that interpreter kem_port (a source that is not kem).
-spec installed(string(), string(), integer()) -> ok | {error, {pip_failed, binary()}}.
installed(Python, Dir, Started) ->
    Secs = (erlang:monotonic_time(millisecond) - Started) div 1000,
    case run_output(Python, ["-c", ?VERSION], "/") of
        {ok, Version} ->
            logger:notice("kem_python: installed kem_port ~ts into ~ts in ~b s; ports will run ~ts",
                          [string:trim(Version), Dir, Secs, Python]),
            ok;
        error ->
            {error, {pip_failed, iolist_to_binary(
                ["pip finished, but ", Python, " has no kem_port: give kem_python:install/1 "
                 "kem's repository (a git URL or a checkout's path)"])}}
    end.

%% @doc Find the interpreter that has kem_port, once; remembered for every
%% port (re)start. `{error, {python_not_found, Why}}' says what was tried.
-spec check() -> {ok, string()} | {error, {python_not_found, binary()}}.
check() ->
    case explicit() of
        {Label, Python} ->
            case has_kem_port(Python) of
                true -> remember(Python);
                false -> not_found([{Label, Python}])
            end;
        false ->
            Tried = candidates(),
            case [P || {_, P} <- Tried, has_kem_port(P)] of
                [Python | _] -> remember(Python);
                [] -> not_found(Tried)
            end
    end.

%% @doc The interpreter `check/0' found, or the first candidate when the app
%% has not checked (tools that start a port without the app).
-spec executable() -> string().
executable() ->
    case persistent_term:get({kem, python}, undefined) of
        undefined ->
            case explicit() of
                {_, Python} -> Python;
                false ->
                    case candidates() of
                        [{_, Python} | _] -> Python;
                        [] -> "python3"
                    end
            end;
        Python ->
            Python
    end.

%% @doc kem's own venv: app env `venv', else `<user data dir>/kem/venv'.
-spec venv_dir() -> string().
venv_dir() ->
    case application:get_env(kem, venv) of
        {ok, Dir} when is_list(Dir); is_binary(Dir) -> to_list(Dir);
        _ -> filename:join(filename:basedir(user_data, "kem"), "venv")
    end.

%%% internals

source() ->
    case application:get_env(kem, python_source) of
        {ok, S} when is_list(S); is_binary(S) -> to_list(S);
        _ ->
            case os:getenv("KEM_PYTHON_SOURCE", false) of
                false -> own_repository();
                S -> S
            end
    end.

%% "git+file://<repo>@<commit>" for the checkout holding this
%% module, or false.
own_repository() ->
    Dir = filename:dirname(filename:absname(code:which(?MODULE))),
    case {os:find_executable("git"), find_up(Dir, ".git")} of
        {Git, Top} when is_list(Git), is_list(Top) ->
            case run_output(Git, ["-C", Top, "rev-parse", "HEAD"], Top) of
                {ok, Rev} -> "git+file://" ++ Top ++ "@" ++ string:trim(Rev);
                error -> false
            end;
        _ ->
            false
    end.

explicit() ->
    case {os:getenv("KEM_PYTHON"), application:get_env(kem, python)} of
        {P, _} when is_list(P), P =/= "" -> {"KEM_PYTHON", P};
        {_, {ok, P}} when is_list(P); is_binary(P) -> {"app env python", to_list(P)};
        _ -> false
    end.

candidates() ->
    Venv = filename:join([venv_dir(), "bin", "python"]),
    [{"checkout .venv", P} || P <- [checkout_venv()], P =/= false]
        ++ [{"kem venv", Venv} || filelib:is_file(Venv)]
        ++ [{"python3 on PATH", P} || P <- [os:find_executable("python3")], P =/= false].

checkout_venv() ->
    case code:which(?MODULE) of
        Path when is_list(Path) ->
            case find_up(filename:dirname(filename:absname(Path)), ".venv/bin/python") of
                false -> false;
                Dir -> filename:join([Dir, ".venv", "bin", "python"])
            end;
        _ -> false
    end.

%% The nearest directory at or above Dir that holds Name.
find_up(Dir, Name) ->
    case filelib:is_file(filename:join(Dir, Name)) of
        true -> Dir;
        false ->
            case filename:dirname(Dir) of
                Dir -> false;
                Parent -> find_up(Parent, Name)
            end
    end.

remember(Python) ->
    persistent_term:put({kem, python}, Python),
    {ok, Python}.

not_found(Tried) ->
    Names = case Tried of
        [] -> ["no interpreter (no KEM_PYTHON, no app env python, no venv, no python3 on PATH)"];
        _ -> [[Label, " ", P] || {Label, P} <- Tried]
    end,
    Why = iolist_to_binary(
        ["no Python with the kem_port package; tried: ", lists:join("; ", Names),
         ". Fix: run ", install_advice(), " (installs kem_port into ", venv_dir(),
         "), or set KEM_PYTHON to an interpreter where `pip install kem_port' was done"]),
    {error, {python_not_found, Why}}.

%% install/0 needs no argument where kem came from git (a rebar3
%% dependency, a checkout: it installs that very commit) or a source is
%% set; only elsewhere must the user name one.
-spec install_advice() -> string().
install_advice() ->
    case source() of
        false -> "kem_python:install(\"<kem's git URL or checkout path>\")";
        _ -> "kem_python:install()"
    end.

%% Run from "/": `python -c' puts the working directory on sys.path, and a
%% node started in the checkout would find its kem_port sources there.
has_kem_port(Python) ->
    filelib:is_file(Python) andalso run(Python, ["-c", ?CHECK], check, "/") =:= ok.

ensure_venv(Base, Dir, Python) ->
    case filelib:is_file(Python) of
        true -> ok;
        false ->
            case os:find_executable(Base) of
                false ->
                    {error, {python_not_found, iolist_to_binary(
                        ["no ", Base, " to create ", Dir, " with (set KEM_SETUP_PYTHON)"])}};
                Exe ->
                    logger:notice("kem_python: creating a venv at ~ts with ~ts", [Dir, Exe]),
                    ok = filelib:ensure_dir(filename:join(Dir, "x")),
                    run(Exe, ["-m", "venv", Dir], venv_failed)
            end
    end.

%% Run Exe with Args; ok on exit 0, else {error, {Tag, last output lines}}.
run(Exe, Args, Tag) ->
    {ok, Cwd} = file:get_cwd(),
    run(Exe, Args, Tag, Cwd).

run(Exe, Args, Tag, Dir) ->
    run(Exe, Args, Tag, Dir, fun(_) -> ok end).

%% OnLine sees each whole output line as it comes (pip's progress).
-spec run(string(), [string()], atom(), string(), fun((binary()) -> term())) -> ok | {error, {atom(), binary()}}.
run(Exe, Args, Tag, Dir, OnLine) ->
    Port = open_port({spawn_executable, Exe},
                     [{args, Args}, {cd, Dir}, {line, 4096}, exit_status, stderr_to_stdout, binary, hide]),
    collect(Port, Tag, OnLine, <<>>, <<>>).

collect(Port, Tag, OnLine, Part, Acc) ->
    receive
        {Port, {data, {noeol, Data}}} ->
            collect(Port, Tag, OnLine, <<Part/binary, Data/binary>>, Acc);
        {Port, {data, {eol, Data}}} ->
            Line = <<Part/binary, Data/binary>>,
            _ = [OnLine(Line) || string:trim(Line) =/= <<>>],
            collect(Port, Tag, OnLine, <<>>, tail(<<Acc/binary, Line/binary, "\n">>));
        {Port, {exit_status, 0}} -> ok;
        {Port, {exit_status, Status}} ->
            {error, {Tag, iolist_to_binary(io_lib:format("exit ~b: ~s", [Status, tail(<<Acc/binary, Part/binary>>)]))}}
    end.

run_output(Exe, Args, Dir) ->
    Port = open_port({spawn_executable, Exe}, [{args, Args}, {cd, Dir}, exit_status, stderr_to_stdout, binary, hide]),
    case collect_output(Port, <<>>) of
        {0, Out} -> {ok, binary_to_list(Out)};
        _ -> error
    end.

collect_output(Port, Acc) ->
    receive
        {Port, {data, Data}} -> collect_output(Port, <<Acc/binary, Data/binary>>);
        {Port, {exit_status, Status}} -> {Status, Acc}
    end.

%% The last ~2 kB of a tool's output: enough to show pip's reason.
tail(Bin) when byte_size(Bin) > 2048 -> binary:part(Bin, byte_size(Bin), -2048);
tail(Bin) -> Bin.

to_list(B) when is_binary(B) -> binary_to_list(B);
to_list(L) -> L.
