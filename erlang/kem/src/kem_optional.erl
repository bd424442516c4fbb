%%% @doc Modules that may or may not be on the code path: HyperBEAM's
%%% (`hb_maps', `hb_event', `hb_json', `dev_metering', `prometheus_*') inside
%%% a node, OTP 27's `json' module. kem looks them up at run time so the same
%%% beams run in a node and on a bare OTP 25.
-module(kem_optional).
-export([has/3]).

%% @doc Is M:F/A there to call (loading M if it can be loaded)?
-spec has(module(), atom(), arity()) -> boolean().
has(M, F, A) ->
    _ = code:ensure_loaded(M),
    erlang:function_exported(M, F, A).
