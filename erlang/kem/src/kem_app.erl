%%% @doc The kem application: starts the supervisor of the Python ports.
-module(kem_app).
-behaviour(application).
-export([start/2, stop/1]).

-spec start(application:start_type(), term()) -> {ok, pid()} | {error, term()}.
start(_Type, _Args) ->
    kem_sup:start_link().

-spec stop(term()) -> ok.
stop(_State) ->
    ok.
