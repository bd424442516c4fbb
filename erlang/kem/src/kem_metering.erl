%%% @doc Reports a call's usage to HyperBEAM's metering device where the
%%% node has one (`dev_metering:consume/3', checked at run time). It keeps
%%% its meters in the calling process's dictionary during a P4 request and
%%% ignores calls outside one, so this runs in the process that called the
%%% device. Resources: `kem-us' (GPU time where the port measured it, else
%%% the caller's wait), `kem-bytes-in', `kem-bytes-out'; the operator
%%% prices them in `metering-rates' like any other resource.
-module(kem_metering).
-export([report/2]).

-spec report(kem:usage(), map()) -> ok.
report(#{us := Us, bytes_in := In, bytes_out := Out}, Opts) ->
    case kem_optional:has(dev_metering, consume, 3) of
        true ->
            [ok = dev_metering:consume(Resource, Amount, Opts)
             || {Resource, Amount} <- [{<<"kem-us">>, Us}, {<<"kem-bytes-in">>, In},
                                       {<<"kem-bytes-out">>, Out}]],
            ok;
        false ->
            ok
    end.
