%%% @doc The adapter description in the original's shape: its six fields
%%% (`name', `vendor', `device', `driver', `backend', `driver_info') with
%%% its types (`vendor' and `device' the PCI ids as integers, `backend'
%%% lower-case, as wgpu's Rust `AdapterInfo' printed them); the port's extra
%%% fields stay. `public/1' also drops what names the node's filesystem.
-module(kem_adapter).
-export([compat/1, public/1]).

-spec compat(map()) -> map().
compat(Info) ->
    Info#{<<"vendor">> => id(Info, <<"vendor_id">>, <<"vendor">>),
          <<"device">> => id(Info, <<"device_id">>, <<"device">>),
          <<"backend">> => string:lowercase(maps:get(<<"backend">>, Info, <<>>))}.

%% @doc `compat/1' without the port's local settings (cache and kernel dirs).
-spec public(map()) -> map().
public(Info) ->
    Compat = compat(Info),
    case maps:get(<<"kem">>, Compat, undefined) of
        Kem when is_map(Kem) ->
            Compat#{<<"kem">> => maps:without([<<"cache_dir">>, <<"kernel_dirs">>, <<"kernel_dir">>], Kem)};
        _ ->
            Compat
    end.

id(Info, IdKey, Key) ->
    case {maps:get(IdKey, Info, undefined), maps:get(Key, Info, undefined)} of
        {N, _} when is_integer(N) -> N;
        {_, N} when is_integer(N) -> N;
        {_, B} when is_binary(B) ->
            try binary_to_integer(B) catch error:badarg -> 0 end;
        _ -> 0
    end.

%%% Tests

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

compat_test() ->
    Port = #{<<"name">> => <<"llvmpipe">>, <<"vendor">> => <<"llvmpipe">>, <<"vendor_id">> => 65541,
             <<"device">> => <<"0">>, <<"device_id">> => 0, <<"backend">> => <<"Vulkan">>,
             <<"kem">> => #{<<"cache_dir">> => <<"/root/.cache">>, <<"kernel_dirs">> => <<"/x">>,
                            <<"verify">> => <<"strict">>}},
    ?assertMatch(#{<<"vendor">> := 65541, <<"device">> := 0, <<"backend">> := <<"vulkan">>,
                   <<"name">> := <<"llvmpipe">>}, compat(Port)),
    ?assertEqual(#{<<"verify">> => <<"strict">>}, maps:get(<<"kem">>, public(Port))),
    %% Already in the original's types: unchanged.
    Orig = #{<<"vendor">> => 4318, <<"device">> => 8708, <<"backend">> => <<"vulkan">>},
    ?assertEqual(Orig, compat(Orig)).
-endif.
