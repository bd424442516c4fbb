%%% @doc Modules that may or may not be on the code path: HyperBEAM's
%%% (`hb_maps', `hb_event', `hb_json', `dev_metering', `prometheus_*') inside
%%% a node, OTP 27's `json' module. kem looks them up at run time so the same
%%% beams run in a node and on a bare OTP 25.
-module(kem_optional).
-export([has/3]).

%% @doc Is M:F/A there to call (loading M if it can be loaded)? Remembered:
%% an absent module costs a search of the whole code path, ~1 ms per
%% lookup, and dev_kem asks several times per request (measured: a 1 MiB
%% binary request took 21 ms through dev_kem against 7 ms for kem:execute
%% before this cache). The code path of a running node does not change.
-spec has(module(), atom(), arity()) -> boolean().
has(M, F, A) ->
    Key = {?MODULE, M, F, A},
    case persistent_term:get(Key, unknown) of
        unknown ->
            _ = code:ensure_loaded(M),
            Has = erlang:function_exported(M, F, A),
            persistent_term:put(Key, Has),
            Has;
        Has ->
            Has
    end.
