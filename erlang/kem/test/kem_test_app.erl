%%% @doc What the eunit modules share: starting the kem application with
%%% some app env and stopping it again, and finding the repository's root
%%% (for files the Python tests share with these: the Lua example, the
%%% session kernels).
-module(kem_test_app).
-export([start/1, stop/1, repo_root/0]).

%% @doc Load kem, set each app env key, start it and what it needs.
-spec start([{atom(), term()}]) -> [atom()].
start(Env) ->
    ok = application:load(kem),
    [ok = application:set_env(kem, Key, Value) || {Key, Value} <- Env],
    {ok, Apps} = application:ensure_all_started(kem),
    Apps.

%% @doc Stop what start/1 started, newest first, and forget kem's env.
-spec stop([atom()]) -> ok.
stop(Apps) ->
    [application:stop(App) || App <- lists:reverse(Apps)],
    application:unload(kem),
    ok.

%% @doc The checkout's root: the first directory above this module's beam
%% that holds examples/kem-device.lua.
-spec repo_root() -> file:filename().
repo_root() ->
    find_up(filename:dirname(code:which(?MODULE))).

find_up(Dir) ->
    case filelib:is_file(filename:join(Dir, "examples/kem-device.lua")) of
        true -> Dir;
        false when Dir =/= "/" -> find_up(filename:dirname(Dir));
        false -> error({no_repo_root_above, code:which(?MODULE)})
    end.
