%%% @doc The kem application: checks the log level (kem_log), finds the
%%% Python half (kem_python), then starts the supervisor of the Python
%%% ports. Without an interpreter that has kem_port, or with an invalid
%%% `log' level, the app does not start, and says why in one error.
-module(kem_app).
-behaviour(application).
-export([start/2, prep_stop/1, stop/1]).

-spec start(application:start_type(), term()) -> {ok, pid()} | {error, term()}.
start(_Type, _Args) ->
    case kem_log:setup() of
        ok ->
            %% A front node without GPUs (kem_cluster) needs no Python.
            case kem_cluster:local_gpus() of
                true -> start_with_python();
                false -> kem_sup:start_link()
            end;
        {error, _} = Error ->
            Error
    end.

start_with_python() ->
    case kem_python:check() of
        {ok, _Python} -> kem_sup:start_link();
        {error, Reason} -> {error, Reason}
    end.

%% @doc Forget the port names first: calls made while the app stops get
%% `not_started', not "the port is restarting".
-spec prep_stop(term()) -> term().
prep_stop(State) ->
    _ = persistent_term:erase({kem, ports}),
    _ = persistent_term:erase({kem, place}),
    State.

-spec stop(term()) -> ok.
stop(_State) ->
    kem_log:teardown().
