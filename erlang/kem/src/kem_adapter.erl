%%% @doc The adapter description as a remote client of the device may see
%%% it: the port's (the original's six fields with its types, plus kem's)
%%% without the port's local settings that name the node's filesystem.
-module(kem_adapter).
-export([public/1]).

-define(LOCAL, [<<"cache_dir">>, <<"kernel_dirs">>, <<"kernel_dir">>, <<"shm_dir">>]).

-spec public(map()) -> map().
public(Info) ->
    case maps:get(<<"kem">>, Info, undefined) of
        Kem when is_map(Kem) -> Info#{<<"kem">> => maps:without(?LOCAL, Kem)};
        _ -> Info
    end.

%%% Tests

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

public_test() ->
    Port = #{<<"vendor">> => 65541, <<"kem">> => #{<<"cache_dir">> => <<"/home/node/.cache">>,
                                                   <<"kernel_dirs">> => <<"/x">>,
                                                   <<"verify">> => <<"strict">>}},
    ?assertEqual(#{<<"vendor">> => 65541, <<"kem">> => #{<<"verify">> => <<"strict">>}}, public(Port)),
    ?assertEqual(#{<<"name">> => <<"x">>}, public(#{<<"name">> => <<"x">>})).
-endif.
