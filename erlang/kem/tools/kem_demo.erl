%%% @doc The README's demo: the example kernels through the Erlang API, as a
%%% node would call them. Started by scripts/demo, which turns the raw RGBA
%%% it writes into PNG files.
-module(kem_demo).
-export([run/1]).

-define(W, 480).
-define(H, 320).

%% @doc Run every example through kem_nif and dev_kem; write images to Dir.
-spec run(string()) -> ok.
run(Dir) ->
    {ok, _} = application:ensure_all_started(kem),
    {ok, Info} = kem_json:decode(kem_nif:adapter_info()),
    say("adapter: ~s (~s, ~s)", [maps:get(<<"name">>, Info), maps:get(<<"adapter_type">>, Info),
                                 maps:get(<<"backend">>, Info)]),
    say("kem_nif:hello() -> ~p", [kem_nif:hello()]),
    Doubled = kem_nif:execute_kernel(<<"double">>, <<1, 3, 5, 7>>, 1),
    say("kem_nif:execute_kernel(<<\"double\">>, <<1,3,5,7>>, 1) -> ~w", [Doubled]),
    Body = <<"{\"kernel_id\":\"double\",\"input_data\":[1,3,5,7],\"output_size_hint\":2}">>,
    {ok, #{<<"status">> := Status, <<"body">> := Out}} =
        dev_kem:execute_kernel(#{}, #{<<"body">> => Body}, #{}),
    say("dev_kem:execute_kernel with ~s -> ~p ~w", [Body, Status, Out]),
    Image = sample_image(),
    ok = file:write_file(filename:join(Dir, "sample.rgba"), Image),
    Params = fun(A, B) -> <<?W:32/little, ?H:32/little, A:32/little, B:32/little>> end,
    Pixelize = fun() -> kem_nif:execute_kernel_with_params(<<"pixelize">>, Image, Params(12, 0)) end,
    Pixelized = twice(io_lib:format("pixelize ~bx~b, 12 px blocks", [?W, ?H]), Pixelize),
    ok = file:write_file(filename:join(Dir, "pixelized.rgba"), Pixelized),
    Glitch = fun() -> {ok, G} = kem:execute(<<"glitch">>, Image, #{params => Params(2026, 40)}), G end,
    Glitched = twice(io_lib:format("glitch ~bx~b, seed 2026, strength 40", [?W, ?H]), Glitch),
    ok = file:write_file(filename:join(Dir, "glitched.rgba"), Glitched),
    {ok, Stats} = kem:stats(),
    [say("port ~p: ~p calls, ~p compiles, errors ~p", [Name, maps:get(calls, S, 0),
                                                      maps:get(compiles, S, 0), maps:get(errors, S)])
     || {Name, S} <- maps:to_list(Stats)],
    ok.

%% A test card: colour gradients with a ring, bars and a grid, so pixelize
%% and glitch both show.
sample_image() ->
    << <<(pixel(X, Y))/binary>> || Y <- lists:seq(0, ?H - 1), X <- lists:seq(0, ?W - 1) >>.

pixel(X, Y) ->
    {Cx, Cy} = {?W div 2, ?H div 2},
    D2 = (X - Cx) * (X - Cx) + (Y - Cy) * (Y - Cy),
    Ring = D2 > 90 * 90 andalso D2 < 120 * 120,
    Grid = (X rem 40 =:= 0) orelse (Y rem 40 =:= 0),
    Bar = (X div 60) rem 2 =:= 0 andalso Y > ?H - 60,
    {R, G, B} = if
        Ring -> {255, 240, 60};
        Grid -> {20, 20, 20};
        Bar -> {230, 40, 90};
        true -> {X * 255 div ?W, Y * 255 div ?H, 255 - X * 255 div ?W}
    end,
    <<R, G, B, 255>>.

%% The first call of a kernel on a port compiles it (WGSL to a pipeline);
%% later calls find it compiled. Say which timing is which.
twice(What, Run) ->
    {First, Out} = timer:tc(Run),
    {Again, Out} = timer:tc(Run),
    say("~ts: ~.1f ms the first time (includes compiling the kernel), ~.1f ms compiled",
        [What, First / 1000, Again / 1000]),
    Out.

say(Format, Args) ->
    io:format("kem demo: " ++ Format ++ "~n", Args).
