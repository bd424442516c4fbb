%%% @doc Small helpers shared by kem's modules.
-module(kem_util).
-export([has/3]).

%% @doc Whether M:F/A can be called here: HyperBEAM's modules inside a
%% node (hb_ao, hb_event, hb_json), OTP 27's json, else a fallback.
-spec has(module(), atom(), arity()) -> boolean().
has(M, F, A) ->
    _ = code:ensure_loaded(M),
    erlang:function_exported(M, F, A).
