%%% @doc The start-up check of the Python half: with no interpreter that has
%%% kem_port the app does not start and says, in one error, what it tried
%%% and how to fix it; a found interpreter is the one every port runs.
-module(kem_python_tests).
-include_lib("eunit/include/eunit.hrl").

python_check_test_() ->
    {timeout, 120, fun() ->
        %% A real interpreter without kem_port: a bare venv.
        Dir = filename:join(["/tmp", "kem_python_tests_" ++ os:getpid()]),
        Bare = filename:join([Dir, "bin", "python"]),
        [] = os:cmd("python3 -m venv --without-pip " ++ Dir ++ " 2>&1"),
        ok = application:load(kem),
        try
            ok = application:set_env(kem, python, Bare),
            {error, {{python_not_found, Why}, _}} = application:start(kem),
            ?assertNotEqual(nomatch, binary:match(Why, list_to_binary(Bare))),
            ?assertNotEqual(nomatch, binary:match(Why, <<"kem_python:install">>)),
            ?assertEqual(undefined, whereis(kem_sup)),
            %% KEM_PYTHON wins over the app env and is named as such.
            true = os:putenv("KEM_PYTHON", Bare),
            ok = application:unset_env(kem, python),
            {error, {python_not_found, Why2}} = kem_python:check(),
            ?assertNotEqual(nomatch, binary:match(Why2, <<"KEM_PYTHON">>)),
            true = os:unsetenv("KEM_PYTHON"),
            %% Unset: the checkout's .venv has kem_port and runs the ports.
            {ok, Found} = kem_python:check(),
            ok = application:start(kem),
            ?assertEqual({ok, pong}, kem:ping()),
            ?assertEqual(Found, kem_port:python_executable()),
            %% Stopped: callers hear so, not "the port is restarting".
            ok = application:stop(kem),
            ?assertMatch({error, {not_started, _}}, kem:ping())
        after
            os:unsetenv("KEM_PYTHON"),
            application:stop(kem),
            application:unload(kem),
            os:cmd("rm -rf " ++ Dir)
        end
    end}.
