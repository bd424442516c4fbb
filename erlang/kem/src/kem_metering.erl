%%% @doc Reports a call's usage to HyperBEAM's metering device where the
%%% node has one, checked at run time: its helper is `meter/3' in some
%%% HyperBEAM versions and `consume/3' in others, same arguments
%%% (Resource, Amount, Opts). It keeps
%%% its meters in the calling process's dictionary during a P4 request and
%%% ignores calls outside one, so this runs in the process that called the
%%% device. Resources: `kem-us' (GPU time where the port measured it, else
%%% the caller's wait), `kem-bytes-in', `kem-bytes-out', and `kem-gas'
%%% where the record has gas (invocations launched plus loop iterations,
%%% docs/metering.md: the same count on every GPU, so a price a client can
%%% check); the operator prices them in `metering-rates' like any other
%%% resource.
-module(kem_metering).
-export([report/2]).

-spec report(kem:usage(), map()) -> ok.
report(Usage = #{us := Us, bytes_in := In, bytes_out := Out}, Opts) ->
    case helper() of
        none -> ok;
        F ->
            Gas = case Usage of #{gas := G} when is_integer(G) -> [{<<"kem-gas">>, G}]; _ -> [] end,
            [ok = dev_metering:F(Resource, Amount, Opts)
             || {Resource, Amount} <- [{<<"kem-us">>, Us}, {<<"kem-bytes-in">>, In},
                                       {<<"kem-bytes-out">>, Out} | Gas]],
            ok
    end.

helper() ->
    case {kem_optional:has(dev_metering, meter, 3), kem_optional:has(dev_metering, consume, 3)} of
        {true, _} -> meter;
        {_, true} -> consume;
        _ -> none
    end.
