%%% @doc kem_python:install/1 says what it does (issue 26): a line as the
%%% venv is made, pip's own lines as pip works, and a success line naming
%%% what was installed and where; before, a minute of silence. And the
%%% start error's fix is `kem_python:install()', no pip source, where kem
%%% came from git (the README says none is needed). Real pip, real venv: the
%%% source is a wheel made here, so nothing is fetched from a network.
-module(kem_python_install_tests).
-include_lib("eunit/include/eunit.hrl").

-export([log/2]).

%% logger handler callback: every event to the test process.
-spec log(logger:log_event(), logger:handler_config()) -> ok.
log(#{msg := Msg, level := Level}, #{config := #{pid := Pid}}) ->
    Text = case Msg of
        {report, R} -> io_lib:format("~p", [R]);
        {string, S} -> S;
        {Format, Args} -> io_lib:format(Format, Args)
    end,
    Pid ! {kem_log, Level, unicode:characters_to_binary(Text)},
    ok.

install_reports_progress_and_success_test_() ->
    {timeout, 180, fun() ->
        Dir = filename:join(["/tmp", "kem_python_install_" ++ os:getpid()]),
        Venv = filename:join(Dir, "venv"),
        Wheel = probe_wheel(Dir, "9.8.7"),
        ok = application:load(kem),
        #{level := Primary} = logger:get_primary_config(),
        ok = logger:set_primary_config(level, notice),
        ok = logger:add_handler(kem_install_probe, ?MODULE, #{level => notice, config => #{pid => self()}}),
        try
            ok = application:set_env(kem, venv, Venv),
            ?assertEqual(ok, kem_python:install(Wheel)),
            Lines = drain([]),
            Notices = [L || {notice, L} <- Lines],
            ?assert(lists:any(fun(L) -> has(L, "creating a venv at " ++ Venv) end, Notices)),
            ?assert(lists:any(fun(L) -> has(L, "pip installing kem_port from " ++ Wheel) end, Notices)),
            %% pip's own lines, relayed as they came.
            ?assert(lists:any(fun(L) -> has(L, "pip: ") andalso has(L, "Successfully installed") end, Notices)),
            %% The success line: the version installed, the venv, the interpreter.
            Success = [L || L <- Notices, has(L, "installed kem_port 9.8.7 into " ++ Venv)],
            ?assertMatch([_], Success),
            ?assert(has(hd(Success), filename:join([Venv, "bin", "python"]))),
            %% A source that does not give the venv kem_port is an error, not ok.
            Other = probe_wheel(filename:join(Dir, "other"), "1.0.0", "not_kem"),
            {ok, _} = uninstall(Venv),
            ?assertMatch({error, {pip_failed, _}}, kem_python:install(Other))
        after
            logger:remove_handler(kem_install_probe),
            logger:set_primary_config(level, Primary),
            application:unset_env(kem, venv),
            application:unload(kem),
            os:cmd("rm -rf " ++ Dir)
        end
    end}.

start_error_names_install_without_a_pip_source_test() ->
    Dir = filename:join(["/tmp", "kem_python_advice_" ++ os:getpid()]),
    Bare = filename:join([Dir, "bin", "python"]),
    [] = os:cmd("python3 -m venv --without-pip " ++ Dir ++ " 2>&1"),
    try
        true = os:putenv("KEM_PYTHON", Bare),
        {error, {python_not_found, Why}} = kem_python:check(),
        %% This module's beams are in a git checkout: install/0 needs nothing.
        ?assertNotEqual(nomatch, binary:match(Why, <<"run kem_python:install() (installs">>)),
        ?assertEqual(nomatch, binary:match(Why, <<"pip source">>))
    after
        os:unsetenv("KEM_PYTHON"),
        os:cmd("rm -rf " ++ Dir)
    end.

%%% helpers

drain(Acc) ->
    receive {kem_log, Level, Line} -> drain([{Level, Line} | Acc])
    after 0 -> lists:reverse(Acc)
    end.

has(Bin, Part) -> binary:match(Bin, unicode:characters_to_binary(Part)) =/= nomatch.

uninstall(Venv) ->
    Python = filename:join([Venv, "bin", "python"]),
    Out = os:cmd(Python ++ " -m pip uninstall -y kem_port 2>&1"),
    {ok, Out}.

probe_wheel(Dir, Version) ->
    probe_wheel(Dir, Version, "kem_port").

%% A pure-Python wheel of one package: `pip install' takes it offline.
probe_wheel(Dir, Version, Name) ->
    Info = Name ++ "-" ++ Version ++ ".dist-info",
    Files = [{Name ++ "/__init__.py", <<"__version__ = \"", (list_to_binary(Version))/binary, "\"\n">>},
             {Info ++ "/METADATA", iolist_to_binary(["Metadata-Version: 2.1\nName: ", Name, "\nVersion: ", Version, "\n"])},
             {Info ++ "/WHEEL", <<"Wheel-Version: 1.0\nGenerator: kem_python_install_tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n">>}],
    Record = [[Path, ",sha256=", b64url(crypto:hash(sha256, Data)), ",", integer_to_list(byte_size(Data)), "\n"]
              || {Path, Data} <- Files],
    All = Files ++ [{Info ++ "/RECORD", iolist_to_binary([Record, Info, "/RECORD,,\n"])}],
    Wheel = filename:join(Dir, Name ++ "-" ++ Version ++ "-py3-none-any.whl"),
    ok = filelib:ensure_dir(Wheel),
    {ok, _} = zip:create(Wheel, [{P, D} || {P, D} <- All]),
    Wheel.

%% RECORD's hashes: urlsafe base64 without padding (PEP 376/427).
b64url(Bin) ->
    Plain = base64:encode(Bin),
    Safe = binary:replace(binary:replace(Plain, <<"+">>, <<"-">>, [global]), <<"/">>, <<"_">>, [global]),
    binary:replace(Safe, <<"=">>, <<>>, [global]).
